// Internal to the cluster client (cluster_client.cc): the bookkeeping of one call over a Redis
// Cluster, kept apart from the routing: its items (a command or script call each, with what
// became of it), the state of the call across its rounds, and what one round leaves for the
// next.
//
// Thread-safety: one call belongs to the thread that runs it.

#ifndef COMMON_REDIS_INTERNAL_CLUSTER_CALL_H_
#define COMMON_REDIS_INTERNAL_CLUSTER_CALL_H_

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/redis/internal/connection.h"
#include "common/redis/internal/resp.h"

namespace bus::redis {

using ConnFor = std::function<std::shared_ptr<Connection>(const std::string& address)>;

// One command or script call of a call, with what became of it.
struct Item {
  std::vector<std::string> args;  // a command; for a script call: numkeys, keys, args
  std::optional<std::string> key;
  std::string ask;             // the node an ASK sent it to; empty: by slot
  std::optional<Reply> reply;  // final, or the last retryable error reply
  absl::Status status;         // its node's failure (a call with `each`)
  bool done = false;
};

// Commands, each routed by its key (slot.h).
std::vector<Item> CommandItems(std::vector<std::vector<std::string>> commands);
// Script calls (numkeys, keys, args), each routed by its first key.
std::vector<Item> CallItems(std::vector<std::vector<std::string>> calls);

// The items' replies, after a call without `each` that returned `st`.
absl::StatusOr<std::vector<Reply>> Replies(const absl::Status& st, std::vector<Item>& items);
// Each item's reply or failure, after a call with `each`.
std::vector<absl::StatusOr<Reply>> EachReply(std::vector<Item>& items);

// Item indexes by node address; std::map so that the order of sends is stable.
using Groups = std::map<std::string, std::vector<size_t>>;

// One call: its items and settings, what is left of them, and how it failed.
struct Call {
  std::vector<Item>& items;
  const Script* script;  // nullptr: the items are commands
  absl::Time deadline;
  std::stop_token stop;
  bool wait;  // WAIT after each node's calls
  bool each;  // a node's failure fails its items alone
  const ConnFor& conn_for;
  std::vector<size_t> pending{};
  absl::Status failed{};           // without `each`: the first transport failure or failed WAIT
  absl::Status map_error{};        // the latest slot map refresh's failure
  std::vector<size_t> unrouted{};  // the latest round found no node for these

  // Items `idx` failed with `st`: with `each` those items, else the call.
  void Fail(absl::Span<const size_t> idx, const absl::Status& st);
};

// A node's pipeline of one round, sent and then waited for.
struct Sent {
  std::string address;
  std::vector<size_t> idx;
  std::future<absl::StatusOr<std::vector<Reply>>> future;
  absl::StatusOr<std::vector<Reply>> result;
};

// What one round leaves for the next.
struct Next {
  std::vector<size_t> pending;
  bool backoff = false;  // TRYAGAIN, CLUSTERDOWN or no master: pause before the next round
  Groups reload;         // NOSCRIPT: the node, its items
};

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_CLUSTER_CALL_H_
