#include "tests/testing/tls_proxy.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/co_spawn.hpp"
#include "boost/asio/connect.hpp"
#include "boost/asio/detached.hpp"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "boost/asio/write.hpp"

namespace bus::testing {
namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

namespace {

// One proxied connection: the client's TLS side and the target's plaintext side.
struct Session {
  Session(asio::ip::tcp::socket client, asio::ssl::context& tls, asio::io_context& io)
      : tls_stream(std::move(client), tls), target(io) {}

  void Close() {
    error_code ignored;
    tls_stream.lowest_layer().close(ignored);
    target.close(ignored);
  }

  asio::ssl::stream<asio::ip::tcp::socket> tls_stream;
  asio::ip::tcp::socket target;
};

// Copies what `from` reads to `to` until either fails; then closes both sides.
template <typename From, typename To>
awaitable<void> Pump(std::shared_ptr<Session> s, From& from, To& to) {
  std::array<char, 16384> buf;
  error_code ec;
  for (;;) {
    const size_t n =
        co_await from.async_read_some(asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
    if (ec) break;
    co_await asio::async_write(to, asio::buffer(buf.data(), n),
                               asio::redirect_error(use_awaitable, ec));
    if (ec) break;
  }
  s->Close();
}

awaitable<void> Serve(std::shared_ptr<Session> s, std::string host, std::string port,
                      std::atomic<int>* handshakes) {
  error_code ec;
  co_await s->tls_stream.async_handshake(asio::ssl::stream_base::server,
                                         asio::redirect_error(use_awaitable, ec));
  if (ec) {
    s->Close();
    co_return;
  }
  handshakes->fetch_add(1);
  asio::ip::tcp::resolver resolver(s->target.get_executor());
  auto endpoints =
      co_await resolver.async_resolve(host, port, asio::redirect_error(use_awaitable, ec));
  if (!ec) {
    co_await asio::async_connect(s->target, endpoints, asio::redirect_error(use_awaitable, ec));
  }
  if (ec) {
    s->Close();
    co_return;
  }
  auto executor = s->target.get_executor();
  asio::co_spawn(executor, Pump(s, s->target, s->tls_stream), asio::detached);
  co_await Pump(s, s->tls_stream, s->target);
}

awaitable<void> Accept(asio::ip::tcp::acceptor& acceptor, asio::ssl::context& tls,
                       asio::io_context& io, std::string host, std::string port,
                       std::atomic<int>* handshakes) {
  for (;;) {
    error_code ec;
    asio::ip::tcp::socket client =
        co_await acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;  // closed: the proxy stops
    auto s = std::make_shared<Session>(std::move(client), tls, io);
    asio::co_spawn(io, Serve(std::move(s), host, port, handshakes), asio::detached);
  }
}

}  // namespace

TlsProxy::TlsProxy() : tls_(asio::ssl::context::tls_server), acceptor_(io_) {}

absl::StatusOr<std::unique_ptr<TlsProxy>> TlsProxy::Start(std::string target, std::string cert,
                                                          std::string key) {
  std::unique_ptr<TlsProxy> p(new TlsProxy());
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("target \"", target, "\" is not host:port"));
  }
  p->target_host_ = target.substr(0, colon);
  p->target_port_ = target.substr(colon + 1);
  error_code ec;
  p->tls_.use_certificate_chain_file(cert, ec);
  if (!ec) p->tls_.use_private_key_file(key, asio::ssl::context::pem, ec);
  if (ec) return absl::InternalError(absl::StrCat("TLS proxy certificate: ", ec.message()));
  const asio::ip::tcp::endpoint at(asio::ip::make_address("127.0.0.1"), 0);
  p->acceptor_.open(at.protocol(), ec);
  if (!ec) p->acceptor_.bind(at, ec);
  if (!ec) p->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::InternalError(absl::StrCat("TLS proxy listen: ", ec.message()));
  asio::co_spawn(
      p->io_,
      Accept(p->acceptor_, p->tls_, p->io_, p->target_host_, p->target_port_, &p->handshakes_),
      asio::detached);
  p->thread_ = std::thread([raw = p.get()] { raw->io_.run(); });
  return p;
}

TlsProxy::~TlsProxy() {
  // The accept loop and the sessions are io_'s handlers: stopped here, destroyed with io_.
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

std::string TlsProxy::address() const {
  return absl::StrCat("127.0.0.1:", acceptor_.local_endpoint().port());
}

}  // namespace bus::testing
