#include "drivers/rabbitmq/internal/management.h"

#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/json/bounded_json.h"
#include "common/net/http_client.h"
#include "nlohmann/json.hpp"

namespace bus::rabbitmq {
namespace {

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

absl::StatusOr<net::HttpResponse> Get(const RabbitMqOptions& o, const std::string& target) {
  net::HttpClientOptions client{
      .server = "RabbitMQ management API",
      .headers = {{"Authorization", absl::StrCat("Basic ", absl::Base64Escape(absl::StrCat(
                                                               o.user, ":", o.password)))}},
      .timeouts = o.timeouts,
      .max_body_bytes = kMaxBody,
  };
  const net::HttpUrl url{.host = o.host, .port = absl::StrCat(o.management.port), .target = target};
  absl::StatusOr<net::HttpResponse> res = net::HttpCallSync(client, url, {});
  if (res.ok() && res->status == 401) {
    return absl::UnauthenticatedError(absl::StrCat("RabbitMQ management API at ", o.host, ":",
                                                   o.management.port, " refused user '", o.user,
                                                   "' (it needs the management tag)"));
  }
  return res;
}

}  // namespace

absl::StatusOr<std::vector<ManagedQueue>> ManagementQueues(const RabbitMqOptions& o) {
  absl::StatusOr<net::HttpResponse> a =
      Get(o, absl::StrCat("/api/queues/", PercentEncode(o.vhost),
                          "?columns=name,messages_ready,messages_unacknowledged"));
  if (!a.ok()) return a.status();
  if (a->status != 200) {
    return absl::UnavailableError(absl::StrCat("RabbitMQ management API: HTTP ", a->status));
  }
  absl::StatusOr<nlohmann::json> j = ParseJsonBounded(a->body);
  if (!j.ok() || !j->is_array()) {
    return absl::InternalError("RabbitMQ management API: not a JSON array");
  }
  auto count = [](const nlohmann::json& q, const char* key) -> int64_t {
    auto it = q.find(key);
    return it != q.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  std::vector<ManagedQueue> out;
  for (const auto& q : *j) {
    auto it = q.find("name");
    if (it == q.end() || !it->is_string()) continue;
    out.push_back(ManagedQueue{it->get<std::string>(), count(q, "messages_ready"),
                               count(q, "messages_unacknowledged")});
  }
  return out;
}

}  // namespace bus::rabbitmq
