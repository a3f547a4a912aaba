#include "common/redis/internal/cluster_map.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/redis/internal/address.h"
#include "common/redis/internal/slot.h"

namespace bus::redis {

std::optional<Redirect> ParseRedirect(absl::string_view error, absl::string_view from_host) {
  std::vector<absl::string_view> parts = absl::StrSplit(error, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || (parts[0] != "MOVED" && parts[0] != "ASK")) return std::nullopt;
  Redirect r;
  r.ask = parts[0] == "ASK";
  if (!absl::SimpleAtoi(parts[1], &r.slot) || r.slot < 0 || r.slot >= kSlots) return std::nullopt;
  const size_t colon = parts[2].rfind(':');
  if (colon == absl::string_view::npos) return std::nullopt;
  absl::string_view host = parts[2].substr(0, colon);
  if (host.empty()) host = from_host;
  int port = 0;
  if (!absl::SimpleAtoi(parts[2].substr(colon + 1), &port) || port < 1 || port > 65535) {
    return std::nullopt;
  }
  r.address = JoinHostPort(host, port);
  return r;
}

absl::StatusOr<SlotMap> ParseClusterSlots(const Reply& reply, absl::string_view asked_host) {
  if (reply.is_error()) return ReplyStatus(reply);
  if (reply.type != Reply::Type::kArray) {
    return absl::InternalError("redis: CLUSTER SLOTS reply is not an array");
  }
  SlotMap map;
  map.owner.assign(kSlots, -1);
  auto node_address = [&](const Reply& n) -> std::optional<std::string> {
    if (n.type != Reply::Type::kArray || n.elements.size() < 2 ||
        n.elements[1].type != Reply::Type::kInteger) {
      return std::nullopt;
    }
    absl::string_view host = n.elements[0].str;
    // "?" and "" both mean: the node did not announce an address; reach it as the one asked.
    if (host.empty() || host == "?") host = asked_host;
    return JoinHostPort(host, n.elements[1].integer);
  };
  std::vector<std::string> replicas;
  for (const Reply& range : reply.elements) {
    if (range.type != Reply::Type::kArray || range.elements.size() < 3 ||
        range.elements[0].type != Reply::Type::kInteger ||
        range.elements[1].type != Reply::Type::kInteger) {
      return absl::InternalError("redis: malformed CLUSTER SLOTS entry");
    }
    const int64_t start = range.elements[0].integer;
    const int64_t end = range.elements[1].integer;
    std::optional<std::string> master = node_address(range.elements[2]);
    if (start < 0 || end >= kSlots || start > end || !master) {
      return absl::InternalError("redis: malformed CLUSTER SLOTS entry");
    }
    auto it = std::find(map.masters.begin(), map.masters.end(), *master);
    const int index = static_cast<int>(it - map.masters.begin());
    if (it == map.masters.end()) map.masters.push_back(*master);
    for (int64_t s = start; s <= end; ++s) map.owner[s] = index;
    for (size_t i = 3; i < range.elements.size(); ++i) {
      if (std::optional<std::string> r = node_address(range.elements[i])) replicas.push_back(*r);
    }
  }
  map.nodes = map.masters;
  for (std::string& r : replicas) {
    if (std::find(map.nodes.begin(), map.nodes.end(), r) == map.nodes.end()) {
      map.nodes.push_back(std::move(r));
    }
  }
  return map;
}

}  // namespace bus::redis
