#include "drivers/rabbitmq/internal/management.h"

#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http.hpp"
#include "nlohmann/json.hpp"

namespace bus::rabbitmq {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

// Largest answer read (a vhost's queue list with names only).
constexpr uint64_t kMaxBody = uint64_t{64} << 20;

std::string PercentEncode(absl::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

struct Answer {
  int status = 0;
  std::string body;
};

absl::StatusOr<Answer> Get(const RabbitMqOptions& o, const std::string& target) {
  const std::string where =
      absl::StrCat("RabbitMQ management API at ", o.host, ":", o.management.port);
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::microseconds(absl::ToInt64Microseconds(o.timeouts.request)));
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(o.host, std::to_string(o.management.port), ec);
  if (ec) return absl::UnavailableError(absl::StrCat(where, ": ", ec.message()));
  http::request<http::empty_body> req(http::verb::get, target, 11);
  req.set(http::field::host, o.host);
  req.set(http::field::authorization,
          absl::StrCat("Basic ", absl::Base64Escape(absl::StrCat(o.user, ":", o.password))));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxBody);
  stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) {
    if ((ec = e)) return;
    http::async_write(stream, req, [&](beast::error_code e2, size_t) {
      if ((ec = e2)) return;
      http::async_read(stream, buffer, parser, [&](beast::error_code e3, size_t) { ec = e3; });
    });
  });
  io.run();
  if (ec) return absl::UnavailableError(absl::StrCat(where, ": ", ec.message()));
  const auto& res = parser.get();
  if (res.result_int() == 401) {
    return absl::UnauthenticatedError(
        absl::StrCat(where, " refused user '", o.user, "' (it needs the management tag)"));
  }
  return Answer{static_cast<int>(res.result_int()), res.body()};
}

}  // namespace

absl::StatusOr<std::vector<ManagedQueue>> ManagementQueues(const RabbitMqOptions& o) {
  absl::StatusOr<Answer> a =
      Get(o, absl::StrCat("/api/queues/", PercentEncode(o.vhost),
                          "?columns=name,messages_ready,messages_unacknowledged"));
  if (!a.ok()) return a.status();
  if (a->status != 200) {
    return absl::UnavailableError(absl::StrCat("RabbitMQ management API: HTTP ", a->status));
  }
  nlohmann::json j = nlohmann::json::parse(a->body, nullptr, false);
  if (!j.is_array()) return absl::InternalError("RabbitMQ management API: not a JSON array");
  auto count = [](const nlohmann::json& q, const char* key) -> int64_t {
    auto it = q.find(key);
    return it != q.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  std::vector<ManagedQueue> out;
  for (const auto& q : j) {
    auto it = q.find("name");
    if (it == q.end() || !it->is_string()) continue;
    out.push_back(ManagedQueue{it->get<std::string>(), count(q, "messages_ready"),
                               count(q, "messages_unacknowledged")});
  }
  return out;
}

}  // namespace bus::rabbitmq
