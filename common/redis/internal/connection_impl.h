// Internal to connection.cc and connection_impl.cc: the state of one Connection and the
// coroutines that run it on its IoThread (connect and handshake, the writer, the read loop, the
// deadline sweep, the reconnect loop). connection.h says what they do for a caller.
//
// Thread-safety: every member is used on the IoThread only; the public methods of Connection
// hand their requests over with asio::post.

#ifndef COMMON_REDIS_INTERNAL_CONNECTION_IMPL_H_
#define COMMON_REDIS_INTERNAL_CONNECTION_IMPL_H_

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "boost/asio/awaitable.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/steady_timer.hpp"
#include "bus/backoff.h"
#include "common/net/duration.h"
#include "common/redis/internal/connection.h"
#include "common/redis/internal/reply_scanner.h"
#include "common/redis/internal/resp.h"

namespace bus::redis {

struct ReaderDeleter {
  void operator()(redisReader* r) const { redisReaderFree(r); }
};
using ReaderPtr = std::unique_ptr<redisReader, ReaderDeleter>;

using net::ToChrono;

struct Connection::Impl : std::enable_shared_from_this<Connection::Impl> {
  using TlsStream = boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>;
  struct Request {
    std::string wire;
    size_t expected = 0;
    std::vector<Reply> replies;
    std::promise<absl::StatusOr<std::vector<Reply>>> promise;
    bool done = false;
    bool cancel = false;
    bool written = false;
    absl::Duration timeout;
    std::chrono::steady_clock::time_point deadline;
  };
  using RequestPtr = std::shared_ptr<Request>;

  Impl(boost::asio::io_context& io, ConnectionOptions options, std::function<void()> on_reconnect);

  // Requests (connection.cc hands them over on the IoThread).
  void Submit(const RequestPtr& req);
  void Cancel(const RequestPtr& req);
  void Shutdown();

  // Completes `req` once; later outcomes (a late reply, a sweep) are dropped.
  void Complete(const RequestPtr& req, absl::StatusOr<std::vector<Reply>> result);
  void CloseSocket();
  // Appends a request to the output buffer and wakes the writer.
  void Enqueue(const RequestPtr& req);
  void OnDeadline(const RequestPtr& req);
  void FailWaiting(const absl::Status& status);
  void FailInflight(const absl::Status& status);
  // Hands received bytes to the reader as far as the scanner accepted them. A refusal is
  // returned in `*refused`: the replies completed before it are still read, then the connection
  // is closed.
  absl::Status Feed(const char* data, size_t n, absl::Status* refused);
  // Counts one reply against the front request; pops it when all its replies arrived.
  void Dispatched(RequestPtr& front);

  // One connection attempt: resolve, connect, TLS, handshake, within options.connect_timeout.
  boost::asio::awaitable<absl::Status> Connect();
  // The TLS handshake on the connected socket (options.tls set).
  boost::asio::awaitable<absl::Status> TlsHandshake();
  // AUTH and SELECT, before any request is written.
  boost::asio::awaitable<absl::Status> Handshake();
  // Reads or writes on the current connection: through TLS when it has it, else the socket.
  boost::asio::awaitable<size_t> ReadSome(boost::asio::mutable_buffer buf,
                                          boost::system::error_code& ec);
  static boost::asio::awaitable<void> WriteAll(std::shared_ptr<TlsStream> stream,
                                               boost::asio::ip::tcp::socket& socket,
                                               boost::asio::const_buffer buf,
                                               boost::system::error_code& ec);
  // A failed read or write as a Status (tls.h's TlsStatus for a TLS connection).
  absl::Status IoError(absl::string_view what, const boost::system::error_code& ec) const;
  // Reads until the reader yields one reply (used by the handshake, before the read loop).
  boost::asio::awaitable<absl::StatusOr<Reply>> ReadOne();
  // Reads replies and completes requests until the connection fails; returns why.
  boost::asio::awaitable<absl::Status> ReadLoop();
  // A connected session: the queued requests go out, the read loop runs until the loss.
  boost::asio::awaitable<void> Serve();

  // The coroutines, each holding the Impl alive.
  static boost::asio::awaitable<void> Session(std::shared_ptr<Impl> self);
  static boost::asio::awaitable<void> Writer(std::shared_ptr<Impl> self, uint64_t gen);
  static boost::asio::awaitable<void> Sweep(std::shared_ptr<Impl> self);

  boost::asio::io_context& io;
  const ConnectionOptions options;
  std::function<void()> on_reconnect;
  std::atomic<uint64_t> reconnects{0};

  boost::asio::ip::tcp::socket socket;
  // TLS over `socket` on the current connection; null without TLS. A new one per connection,
  // shared with that connection's writer so that a late write completion never touches the
  // next connection's stream.
  std::shared_ptr<TlsStream> tls;
  boost::asio::steady_timer write_signal;
  // Armed with Backoff::Next() between failed connect attempts (an asynchronous wait: the
  // IoThread must not block).
  boost::asio::steady_timer backoff_timer;
  boost::asio::steady_timer sweep;
  Backoff backoff;
  bool sweeping = false;  // the Sweep coroutine is alive
  ReaderPtr reader;
  // Checks every byte received on the current connection before `reader` sees it.
  std::optional<ReplyScanner> scanner;
  bool running = false;  // the session coroutine is alive
  bool ready = false;    // connected and handshaken
  bool shutdown = false;
  bool closed_by_us = false;
  bool ever_connected = false;
  bool lost = false;      // the last connection was lost, not closed by us
  bool received = false;  // a byte arrived on the current connection
  // The server of the current TLS connection asked for a client certificate.
  bool tls_certificate_requested = false;
  uint64_t generation = 0;  // of the current connection: a writer of an older one stops
  size_t front_seen = 0;    // replies received for inflight.front()
  std::string out_buf;
  // Why the latest connection attempt failed; OK once one succeeds.
  absl::Status last_connect_error;
  std::deque<RequestPtr> waiting;   // not written yet (no connection)
  std::deque<RequestPtr> inflight;  // in out_buf or written, awaiting replies
};

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_CONNECTION_IMPL_H_
