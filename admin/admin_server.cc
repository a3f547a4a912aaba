#include "admin/admin_server.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <list>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/thread_pool.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"
#include "bus/backoff.h"
#include "nlohmann/json.hpp"

namespace bus {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;
using boost::system::error_code;

using Response = http::response<http::string_body>;

Response Make(http::status status, absl::string_view content_type, std::string body) {
  Response res(status, 11);
  res.set(http::field::content_type, std::string(content_type));
  res.set(http::field::cache_control, "no-store");
  res.body() = std::move(body);
  return res;
}

Response Json(http::status status, const nlohmann::json& body) {
  return Make(status, "application/json", body.dump() + "\n");
}

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("AdminServerOptions.", field, ": ", what));
}

}  // namespace

// The coroutines and probes use `this` without owning it: Stop() joins the I/O thread and the
// pool before the Impl (and the io_context, which destroys the suspended coroutines) goes.
struct AdminServer::Impl {
  explicit Impl(AdminServerOptions o)
      : options(std::move(o)), acceptor(io), pool(static_cast<size_t>(options.probe_threads)) {}

  const AdminServerOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::thread_pool pool;
  std::thread thread;
  int port = 0;
  std::atomic<bool> stopped{false};
  // The open connections' sockets, oldest first; touched on the I/O thread only.
  std::list<tcp::socket*> open;
  std::atomic<int> open_count{0};

  // Closes the oldest connection: its session's pending read or write fails and it ends.
  void CloseOldest() {
    if (open.empty()) return;
    error_code ignored;
    open.front()->close(ignored);
  }

  // /healthz: reads each handler's state only (no I/O), on the I/O thread.
  Response Health() const {
    std::vector<std::string> down;
    for (const Handler* h : options.handlers) {
      if (!h->Stats().running) down.push_back(absl::StrCat("queue ", h->options().queue));
    }
    if (down.empty()) return Json(http::status::ok, {{"status", "ok"}});
    return Json(http::status::service_unavailable,
                {{"status", "unhealthy"},
                 {"reason", absl::StrCat(absl::StrJoin(down, ", "), ": not running")}});
  }

  // /readyz: pings, on the probe pool.
  Response Readiness() const {
    for (const Handler* h : options.handlers) {
      if (absl::Status st = h->Ready(options.ping_timeout); !st.ok()) {
        return Json(http::status::service_unavailable,
                    {{"status", "not ready"}, {"reason", std::string(st.message())}});
      }
    }
    return Json(http::status::ok, {{"status", "ready"}});
  }

  Response Metrics() const {
    if (options.metrics == nullptr) {
      return Make(http::status::not_found, "text/plain", "no metrics registry\n");
    }
    return Make(http::status::ok, absl::StrCat(kPrometheusContentType, "; charset=utf-8"),
                options.metrics->Render());
  }

  // Runs `fn` on the probe pool and resumes on the I/O thread with its response.
  template <typename Fn>
  awaitable<Response> OnPool(Fn fn) {
    co_return co_await asio::co_spawn(
        pool.get_executor(), [fn]() -> awaitable<Response> { co_return fn(); }, use_awaitable);
  }

  awaitable<Response> Respond(const http::request<http::string_body>& req) {
    if (req.method() != http::verb::get) {
      Response res = Make(http::status::method_not_allowed, "text/plain", "GET only\n");
      res.set(http::field::allow, "GET");
      co_return res;
    }
    absl::string_view target(req.target().data(), req.target().size());
    if (const size_t q = target.find('?'); q != absl::string_view::npos) {
      target = target.substr(0, q);
    }
    if (target == "/healthz") co_return Health();
    if (target == "/readyz") co_return co_await OnPool([this] { return Readiness(); });
    if (target == "/metrics") co_return co_await OnPool([this] { return Metrics(); });
    co_return Make(http::status::not_found, "text/plain", "not found\n");
  }

  awaitable<void> Session(tcp::socket socket) {
    const std::list<tcp::socket*>::iterator self = open.insert(open.end(), &socket);
    open_count.store(static_cast<int>(open.size()), std::memory_order_relaxed);
    boost::beast::flat_buffer buffer;
    asio::steady_timer deadline(io);
    for (;;) {
      // One deadline for the whole exchange: a client that does not send a whole request, or
      // does not read the answer, in time is cut off.
      deadline.expires_after(absl::ToChronoNanoseconds(options.exchange_timeout));
      deadline.async_wait([&socket](const error_code& ec) {
        if (!ec) {
          error_code ignored;
          socket.close(ignored);
        }
      });
      http::request_parser<http::string_body> parser;
      parser.body_limit(64 * 1024);
      error_code ec;
      co_await http::async_read(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      const http::request<http::string_body>& req = parser.get();
      Response res = co_await Respond(req);
      res.keep_alive(req.keep_alive());
      res.prepare_payload();
      co_await http::async_write(socket, res, asio::redirect_error(use_awaitable, ec));
      deadline.cancel();
      if (ec || !res.keep_alive()) break;
    }
    deadline.cancel();
    error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    open.erase(self);
    open_count.store(static_cast<int>(open.size()), std::memory_order_relaxed);
  }

  awaitable<void> Accept() {
    // Accepting fails when the process is out of file descriptors (EMFILE, ENFILE) or the
    // kernel is short of memory; the asio timer is armed by the one Backoff (bus/backoff.h).
    Backoff backoff({.initial = absl::Milliseconds(1), .max = absl::Seconds(1)});
    asio::steady_timer pause(io);
    for (;;) {
      error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
      if (ec) {
        if (!acceptor.is_open()) co_return;
        if (ec.value() == EMFILE || ec.value() == ENFILE) CloseOldest();
        pause.expires_after(absl::ToChronoNanoseconds(backoff.Next()));
        co_await pause.async_wait(asio::redirect_error(use_awaitable, ec));
        continue;
      }
      backoff.Reset();
      if (static_cast<int>(open.size()) >= options.max_connections) CloseOldest();
      asio::co_spawn(io, Session(std::move(socket)), asio::detached);
    }
  }
};

absl::StatusOr<std::unique_ptr<AdminServer>> AdminServer::Start(AdminServerOptions options) {
  if (options.port < 0 || options.port > 65535) return Invalid("port", "must be in [0, 65535]");
  if (options.ping_timeout <= absl::ZeroDuration()) return Invalid("ping_timeout", "must be > 0");
  if (options.exchange_timeout <= absl::ZeroDuration()) {
    return Invalid("exchange_timeout", "must be > 0");
  }
  if (options.max_connections < 1) return Invalid("max_connections", "must be >= 1");
  if (options.probe_threads < 1) return Invalid("probe_threads", "must be >= 1");
  for (const Handler* h : options.handlers) {
    if (h == nullptr) return Invalid("handlers", "null handler");
  }
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(options.address, ec);
  if (ec) return Invalid("address", absl::StrCat("\"", options.address, "\" is not an IP address"));

  auto impl = std::make_shared<Impl>(std::move(options));
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(impl->options.port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("admin server: cannot listen on ",
                                               impl->options.address, ":", impl->options.port, ": ",
                                               ec.message()));
  }
  impl->port = impl->acceptor.local_endpoint().port();
  asio::co_spawn(impl->io, impl->Accept(), asio::detached);
  impl->thread = std::thread([raw = impl.get()] { raw->io.run(); });
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

AdminServer::AdminServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

AdminServer::~AdminServer() { Stop(); }

int AdminServer::port() const { return impl_->port; }

int AdminServer::connections() const { return impl_->open_count.load(std::memory_order_relaxed); }

void AdminServer::Stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->io.stop();
  impl_->thread.join();
  // The I/O thread is gone, so nothing else touches the acceptor: new connections are refused
  // from here on.
  error_code ignored;
  impl_->acceptor.close(ignored);
  // Probes in progress finish (each Ping is bounded); their replies are dropped.
  impl_->pool.join();
}

}  // namespace bus
