#include "drivers/rabbitmq/internal/management.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/net/http_client.h"
#include "nlohmann/json.hpp"

namespace bus::rabbitmq {
namespace {

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

// One GET through common/net's client, with the AMQP user's basic authentication.
absl::StatusOr<Answer> Get(const RabbitMqOptions& o, const std::string& target) {
  net::HttpClientOptions client;
  client.server = "RabbitMQ management API";
  client.headers = {{"Authorization", absl::StrCat("Basic ", absl::Base64Escape(absl::StrCat(
                                                                 o.user, ":", o.password)))}};
  client.timeouts = o.timeouts;
  client.max_body_bytes = uint64_t{64} << 20;  // a vhost's queue list, names and counts only
  net::HttpUrl url{.host = o.host, .port = std::to_string(o.management.port), .target = target};
  absl::StatusOr<net::HttpResponse> res = net::HttpCallSync(client, url, {.method = "GET"});
  if (!res.ok()) return res.status();
  if (res->status == 401) {
    return absl::UnauthenticatedError(absl::StrCat("RabbitMQ management API refused user '", o.user,
                                                   "' (it needs the management tag)"));
  }
  return Answer{res->status, std::move(res->body)};
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
