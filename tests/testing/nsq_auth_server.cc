#include "tests/testing/nsq_auth_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"

namespace bus::testing {

NsqAuthServer::NsqAuthServer(std::string secret)
    : secret_(std::move(secret)), acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
  thread_ = std::thread([this] { Run(); });
}

NsqAuthServer::~NsqAuthServer() {
  stop_ = true;
  boost::system::error_code ec;
  boost::asio::ip::tcp::socket s(io_);
  s.connect(acceptor_.local_endpoint(), ec);  // unblocks accept()
  thread_.join();
}

std::string NsqAuthServer::address() const {
  return absl::StrCat("127.0.0.1:", acceptor_.local_endpoint().port());
}

void NsqAuthServer::Run() {
  namespace http = boost::beast::http;
  const std::string granted = absl::StrCat("secret=", secret_);
  while (!stop_) {
    boost::asio::ip::tcp::socket socket(io_);
    boost::system::error_code ec;
    acceptor_.accept(socket, ec);
    if (ec || stop_) continue;
    boost::beast::flat_buffer buffer;
    http::request<http::string_body> req;
    http::read(socket, buffer, req, ec);
    if (ec) continue;
    requests_.fetch_add(1);
    // The whole parameter, so that a secret that merely starts with ours is refused.
    const std::string target(req.target());
    const size_t at = target.find(granted);
    const size_t end = at + granted.size();
    const bool ok = !refusing_.load() && at != std::string::npos &&
                    (end == target.size() || target[end] == '&');
    http::response<http::string_body> res(ok ? http::status::ok : http::status::forbidden, 11);
    res.set(http::field::content_type, "application/json");
    res.body() = ok ? R"({"ttl":3600,"identity":"test","authorizations":[)"
                      R"({"topic":".*","channels":[".*"],"permissions":["subscribe","publish"]}]})"
                    : R"({"message":"NOT_AUTHORIZED"})";
    res.prepare_payload();
    http::write(socket, res, ec);
  }
}

}  // namespace bus::testing
