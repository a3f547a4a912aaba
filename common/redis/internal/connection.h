// A Redis client connection over Boost.Asio, speaking RESP2 with hiredis's
// redisFormatSdsCommandArgv (requests) and redisReader (replies). Debian's hiredis 0.14 has no
// async timeouts and no TLS, so the socket, TLS (Asio's SSL stream over OpenSSL, tls.h), the
// deadlines and the reconnection live here.
//
//   bus::redis::IoThread io;
//   std::shared_ptr<bus::redis::Connection> conn =
//       bus::redis::Connection::Create(&io, {.port = 6379});
//   absl::StatusOr<bus::redis::Reply> r = conn->Command({"PING"}, absl::Seconds(1));
//   ...
//   conn->Shutdown();  // before `io` is destroyed
//
//  - Pipelining: requests from any number of threads are written back to back on one socket
//    without waiting for earlier replies; replies are matched to requests in order.
//  - Deadlines: every request has one. A request still queued or unanswered at its deadline
//    fails with DeadlineExceeded; when it was already written, the socket is closed (the server
//    may be hung) and the next request reconnects.
//  - Reconnection: the connection is opened lazily by the first request and re-opened after a
//    loss, with options.backoff (bus::Backoff, jitter from options.random) between failed
//    attempts.
//    Requests that were written on a lost connection fail with Unavailable; they are not
//    re-sent (the caller decides what is safe to repeat). Each re-established connection calls
//    `on_reconnect`.
//  - Handshake: with TLS, the TLS handshake first (the server's certificate verified for
//    tls_server_name); then AUTH (password, or ACL username and password) and SELECT run on
//    every (re)connect before any request is written. With TLS and neither of them, a PING: a
//    TLS 1.3 server refuses a client certificate only after the client's handshake is done,
//    and this makes that refusal a failed connect, not a failed request.
//  - Bounds: a reply larger than options.max_reply_bytes or with more than
//    options.max_reply_elements array elements is refused as soon as its length headers
//    announce it, before hiredis allocates anything for it, and bytes that arrive while no
//    request is pending are refused at the first byte: either way the connection is closed and
//    its pending requests fail with Unavailable (see reply_scanner.h).
//  - Scripts: Eval() runs a Lua script with EVALSHA, loading it (SCRIPT LOAD) the first time
//    and again after NOSCRIPT (a restarted or failed-over server has no scripts).
//
// Errors (Status codes): Unavailable (cannot connect, connection lost), DeadlineExceeded (the
// request's deadline passed), Cancelled (the request's stop token fired), Unauthenticated
// (AUTH refused, or a password sent to a server that has none; a server certificate that fails
// verification, or this client's certificate refused or missing), FailedPrecondition (a TLS
// client on a plaintext port, no TLS version in common). A server that breaks the
// protocol is treated as a lost connection (Unavailable, "redis protocol error: ..."). A Redis
// error reply is not a transport error: it is returned as a Reply of type kError inside an OK
// result.
//
// Ownership: a Connection must be Shutdown() before the IoThread it runs on is destroyed.
// Thread-safety: Execute/Command/Eval/Shutdown are safe from any thread except the IoThread's.

#ifndef COMMON_REDIS_INTERNAL_CONNECTION_H_
#define COMMON_REDIS_INTERNAL_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ssl/context.hpp"
#include "bus/backoff.h"
#include "bus/random.h"
#include "common/redis/internal/resp.h"

namespace bus::redis {

struct ConnectionOptions {
  // Server address. Default 127.0.0.1:6379.
  std::string host = "127.0.0.1";
  int port = 6379;
  // ACL user; empty: the default user (AUTH <password>).
  std::string username{};
  // Password for AUTH; empty: no AUTH. Never logged or included in errors.
  std::string password{};
  // Named in AUTH and NOAUTH errors, so a user knows what to fix: which part of the program
  // connects ("redis driver", "redis idempotency store") and where the password came from
  // ("the URL", "REDIS_PASSWORD"). Never the password itself.
  std::string component = "redis client";
  std::string password_source = "the options";
  // Where to put a password, said when the server answers NOAUTH and none was given; empty:
  // the data nodes' places (the URL, REDIS_PASSWORD, RedisOptions.password).
  std::string noauth_hint{};
  // Database for SELECT; 0 skips SELECT.
  int db = 0;
  // TLS: the context every connection of a client shares (tls.h MakeRedisTlsContext); nullptr:
  // plaintext, unless tls_error is set.
  std::shared_ptr<boost::asio::ssl::context> tls{};
  // The name the server's certificate must hold (and SNI); empty: host.
  std::string tls_server_name{};
  // False: any server certificate is accepted (RedisOptions::tls.insecure_skip_verify).
  bool tls_verify = true;
  // Why the TLS context could not be made: every connect attempt fails with it.
  absl::Status tls_error{};
  // Deadline of one connect attempt including the TLS handshake, AUTH and SELECT. Default 2 s.
  absl::Duration connect_timeout = absl::Seconds(2);
  // The pause between failed connect attempts, and its jitter (nullptr: DefaultRandom()).
  BackoffPolicy backoff{.initial = absl::Milliseconds(50),
                        .max = absl::Seconds(2),
                        .jitter = BackoffPolicy::Jitter::kFull};
  std::shared_ptr<RandomSource> random{};
  // Bounds on one reply (common/redis/internal/reply_scanner.h): its bytes, headers and nested
  // arrays included, and its array elements in all. A server that announces or sends more has the
  // connection closed; the requests pending on it fail with Unavailable. Defaults 512 MiB
  // (Redis's own largest string, proto-max-bulk-len) and 1,048,576 elements.
  int64_t max_reply_bytes = int64_t{512} << 20;
  int64_t max_reply_elements = int64_t{1} << 20;
  // Counts this connection while it is connected (AUTH and SELECT done, until it is lost or
  // shut down); shared by the connections of one client. Null: not counted.
  std::shared_ptr<std::atomic<int64_t>> open_count{};
};

// An io_context run by one background thread. Its destructor returns once every Connection on
// it has been Shutdown() and their operations have finished.
class IoThread {
 public:
  IoThread();
  ~IoThread();
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  boost::asio::io_context& io() { return io_; }
  bool InThisThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

// A Lua script run by SHA, with its source for SCRIPT LOAD.
struct Script {
  explicit Script(std::string src) : source(std::move(src)) {}
  std::string source{};
};

class Connection {
 public:
  static std::shared_ptr<Connection> Create(IoThread* io, ConnectionOptions options,
                                            std::function<void()> on_reconnect = nullptr);
  ~Connection();

  // Sends `commands` back to back and returns one reply per command, in order. The result is
  // an error only for transport failures (see the header comment); each reply may be a Redis
  // error. `timeout` bounds the whole call; `stop` cancels it (Cancelled).
  absl::StatusOr<std::vector<Reply>> Execute(std::vector<std::vector<std::string>> commands,
                                             absl::Duration timeout, std::stop_token stop = {});

  // Execute() without waiting: the future holds what Execute() would return. The call must be
  // waited for (or the Connection Shutdown()) before the IoThread goes.
  std::future<absl::StatusOr<std::vector<Reply>>> ExecuteAsync(
      std::vector<std::vector<std::string>> commands, absl::Duration timeout);

  // One command. Like Execute().
  absl::StatusOr<Reply> Command(std::vector<std::string> args, absl::Duration timeout,
                                std::stop_token stop = {});

  // Runs `script` once per entry of `calls` (each: numkeys, then keys and args, as for
  // EVALSHA), pipelined, loading the script when the server lacks it. Replies as Execute().
  // A non-empty `then` is one more command pipelined right after the calls (and after any
  // repeat of them), on the same connection (WAIT must be); its reply comes last.
  absl::StatusOr<std::vector<Reply>> Eval(const Script& script,
                                          std::vector<std::vector<std::string>> calls,
                                          absl::Duration timeout,
                                          std::vector<std::string> then = {});

  // Closes the socket and fails every pending request with Unavailable; later requests fail at
  // once. Idempotent; blocks until done.
  void Shutdown();

  // Times a lost connection was re-established.
  uint64_t reconnects() const;

 private:
  struct Impl;
  Connection(IoThread* io, ConnectionOptions options, std::function<void()> on_reconnect);

  absl::StatusOr<std::string> ScriptSha(const Script& script, absl::Duration timeout, bool reload);

  IoThread* io_thread_;
  std::shared_ptr<Impl> impl_;
  absl::Mutex sha_mu_;
  absl::flat_hash_map<const Script*, std::string> sha_ ABSL_GUARDED_BY(sha_mu_);
};

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_CONNECTION_H_
