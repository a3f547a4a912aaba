// One TCP connection to nsqd speaking protocol V2, driven by Boost.Asio coroutines on an
// io_context that the owner runs.
//
//   auto conn = Connection::Create(io, options, listener);
//   co_await conn->Handshake();   // connect, magic, IDENTIFY, TLS and compression, AUTH
//   conn->Request(sub_command, on_response);    // commands with a response, matched in order
//   conn->Send(fin_command);                    // commands without one (RDY, FIN, REQ, TOUCH)
//
// Request and Send write from the calling thread when the write loop is idle (the common case
// for acks and publishes: no hand-off to the I/O thread), and otherwise queue for the write
// loop on the io_context; bytes reach the socket in call order either way.
//
// The connection answers heartbeats with NOP, closes itself when nsqd has been silent for two
// heartbeat intervals, when a request has had no response for `request_timeout` (an nsqd that
// answers heartbeats but not PUB), and on a malformed frame or a fatal error frame (every
// pending request then fails). Non-fatal error frames (E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED)
// go to the listener and leave the connection open.
//
// With a TLS context the connection asks for tls_v1 in IDENTIFY and, when nsqd agrees, runs
// the TLS handshake right after the IDENTIFY response; with a codec it asks for snappy or
// deflate and wraps the stream (over TLS when both) after that, in nsqd's order. The direct
// write from the calling thread is then off: every write goes through the write loop, which
// owns the encoder and the TLS stream's writing half.
//
// Ownership: shared; the coroutines hold a reference until the connection closes. The listener
// is held weakly. Thread-safety: Request, Send, Close and the accessors are safe from any
// thread; Handshake runs on the io_context. Callbacks (request completions and the listener) run
// on the io_context's thread.

#ifndef DRIVERS_NSQ_INTERNAL_CONNECTION_H_
#define DRIVERS_NSQ_INTERNAL_CONNECTION_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boost/asio/awaitable.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl/context.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/steady_timer.hpp"
#include "common/net/tls_context.h"
#include "drivers/nsq/internal/address.h"
#include "drivers/nsq/internal/compression.h"
#include "drivers/nsq/internal/protocol.h"

namespace bus::nsq {

// How TLS errors name the options that fix them.
inline constexpr net::TlsOptionNames kNsqTlsNames{.field = "NsqOptions.tls", .url = "nsq://"};

enum class Codec { kNone, kSnappy, kDeflate };

struct ConnectionOptions {
  // "host:port" of nsqd (or "[v6]:port").
  std::string address{};
  IdentifyRequest identify{};
  // Sent with AUTH when nsqd requires it. Never logged and never in a Status.
  std::string auth_secret{};
  // Bound on TCP connect plus handshake (IDENTIFY and AUTH included).
  absl::Duration connect_timeout = absl::Seconds(5);
  // Bound on each Request's response, counted from the call: when the oldest pending request
  // has waited this long the connection closes and every pending request fails with
  // Unavailable. Must be > 0.
  absl::Duration request_timeout = absl::Seconds(10);
  // Largest frame accepted from nsqd; a larger size field closes the connection.
  size_t max_frame_bytes = (1 << 20) + 1024;
  // TLS: asked for when set (a client context: CAs, client certificate, verify mode).
  std::shared_ptr<boost::asio::ssl::context> tls_context{};
  // Refuse an nsqd that does not offer TLS (else continue in plaintext).
  bool tls_required = true;
  // SNI and the name checked against nsqd's certificate; empty: the address's host.
  std::string tls_server_name{};
  // Check nsqd's certificate chain and name (off only with NsqOptions.tls.insecure_skip_verify).
  bool tls_verify = true;
  Codec codec = Codec::kNone;
  int deflate_level = 6;
  // Counts this connection while it is open (from a successful Handshake until it closes);
  // shared by every connection of a driver (DriverStats::connections). Null: not counted.
  std::shared_ptr<std::atomic<int64_t>> open_count{};
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // Messages in the order nsqd sent them; several at once when they arrived together.
    virtual void OnMessages(Connection* conn, std::vector<Message>& messages) = 0;
    // A non-fatal error frame (the connection stays open).
    virtual void OnNonFatalError(Connection* conn, const ErrorFrame& error) = 0;
    // Called once, when the connection closes for any reason (including Close()).
    virtual void OnClose(Connection* conn, const absl::Status& why) = 0;
  };

  using ResponseFn = std::function<void(absl::StatusOr<std::string>)>;

  static std::shared_ptr<Connection> Create(boost::asio::io_context& io, ConnectionOptions options,
                                            std::weak_ptr<Listener> listener);

  ~Connection();

  // Connects and negotiates. OK, or Unavailable (unreachable, timed out, closed), or the mapped
  // nsqd error (InvalidArgument for a bad IDENTIFY, Unauthenticated for a wrong secret,
  // FailedPrecondition when nsqd requires AUTH and no secret is configured), or a TLS failure:
  // FailedPrecondition when nsqd's certificate fails verification (the reason and the option
  // to fix in the message) or nsqd offers no TLS and it is required, Unauthenticated when nsqd
  // refuses the client certificate (or its absence). On success the
  // read, write and heartbeat loops are running.
  boost::asio::awaitable<absl::Status> Handshake();

  // Writes `command` and calls `done` with nsqd's response (OK or the data of a response frame),
  // or an error: the mapped error frame, or Unavailable if the connection closes first or no
  // response comes within `request_timeout` (the connection is then closed).
  void Request(std::string command, ResponseFn done);

  // Writes `command`, which has no response. Dropped if the connection is closed.
  void Send(absl::string_view command);

  // Closes the socket; pending requests fail with `why`. Idempotent.
  void Close(absl::Status why);

  bool closed() const { return closed_.load(std::memory_order_acquire); }
  uint64_t id() const { return id_; }
  // The context whose (single) thread runs this connection.
  boost::asio::io_context& io() const { return io_; }
  const std::string& address() const { return options_.address; }
  // Valid after a successful Handshake.
  const IdentifyResponse& identify() const { return identify_; }

 private:
  Connection(boost::asio::io_context& io, ConnectionOptions options,
             std::weak_ptr<Listener> listener);

  boost::asio::awaitable<absl::StatusOr<Frame>> ReadFrame();
  // Reads from the socket (through TLS and the decoder when on) until `reader_` has new bytes.
  boost::asio::awaitable<absl::Status> Fill();
  // Writes `data` to the socket (through the encoder and TLS when on).
  boost::asio::awaitable<absl::Status> WriteAll(absl::string_view data);
  // TLS handshake on the connected socket, then nsqd's OK over TLS.
  // The steps of Handshake, in order. Each returns the first failure; Handshake closes.
  boost::asio::awaitable<absl::Status> Connect(const std::string& host, const std::string& port);
  // Sends the magic and IDENTIFY (`*asked`, what the driver asked for) and reads nsqd's answer
  // into identify_.
  boost::asio::awaitable<absl::Status> Identify(IdentifyRequest* asked);
  // TLS, then snappy or deflate, as nsqd agreed to what was `asked`.
  boost::asio::awaitable<absl::Status> Upgrade(const std::string& host,
                                               const IdentifyRequest& asked);
  boost::asio::awaitable<absl::Status> UpgradeTls(const std::string& host);
  boost::asio::awaitable<absl::Status> UpgradeCompression();
  boost::asio::awaitable<absl::Status> Authenticate();
  // The next response frame of the handshake (heartbeats skipped); an error frame or a message
  // is a failure of `what`.
  boost::asio::awaitable<absl::StatusOr<std::string>> ReadHandshakeResponse(absl::string_view what);
  // Marks the connection open and starts its read, write and watch loops.
  void Start(std::shared_ptr<Connection> self);
  // The status of a failed socket or TLS operation.
  absl::Status TransportError(absl::string_view what, const boost::system::error_code& ec);
  // Each loop takes the reference that keeps the connection alive as a parameter, so it lives
  // in the coroutine frame from the moment the loop is spawned.
  boost::asio::awaitable<void> ReadLoop(std::shared_ptr<Connection> self);
  boost::asio::awaitable<void> WriteLoop(std::shared_ptr<Connection> self);
  boost::asio::awaitable<void> HeartbeatWatch(std::shared_ptr<Connection> self);
  boost::asio::awaitable<void> RequestWatch(std::shared_ptr<Connection> self);
  // Writes what the socket takes at once of `data` from the calling thread when the write
  // loop is idle and nothing is queued (sparing the hand-off to the I/O thread); returns the
  // bytes written, 0 when the write loop must take them.
  size_t WriteNowLocked(absl::string_view data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleFrame(Frame frame);
  void FlushMessages();
  void CloseOnIo(absl::Status why);

  boost::asio::io_context& io_;
  const ConnectionOptions options_;
  const std::weak_ptr<Listener> listener_;
  const uint64_t id_;
  boost::asio::ip::tcp::socket socket_;
  // Over `socket_` once TLS is negotiated (declared after it: destroyed first).
  std::unique_ptr<boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>> tls_;
  // Once compression is negotiated: encoding by the write loop, decoding by the read loop.
  std::unique_ptr<StreamCodec> codec_;
  std::string read_buf_;            // the reading coroutine's (handshake, then read loop)
  std::string decoded_;             // likewise
  std::string encoded_;             // the writing coroutine's (handshake, then write loop)
  boost::asio::steady_timer wake_;  // cancelled to wake the write loop
  boost::asio::steady_timer watchdog_;
  boost::asio::steady_timer request_timer_;
  FrameReader reader_;
  std::vector<Message> batch_;  // read loop only: messages not yet handed to the listener
  IdentifyResponse identify_;
  std::atomic<bool> closed_{false};
  std::atomic<int64_t> last_read_ns_{0};  // steady clock, at the last read from the socket
  // Network pacing (heartbeat silence) is real time on the steady clock, never the driver's
  // injected clock: nsqd's heartbeats arrive in real time.
  static int64_t SteadyNanos();

  absl::Mutex mu_;
  std::string out_ ABSL_GUARDED_BY(mu_);
  bool writer_idle_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // The socket's descriptor once the loops run, -1 before and after (see WriteNowLocked).
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  struct Pending {
    ResponseFn done{};
    std::chrono::steady_clock::time_point deadline{};
  };
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_CONNECTION_H_
