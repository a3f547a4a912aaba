#include "common/redis/internal/cluster_call.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "common/redis/internal/slot.h"

namespace bus::redis {

std::vector<Item> CommandItems(std::vector<std::vector<std::string>> commands) {
  std::vector<Item> items(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    if (std::optional<absl::string_view> k = CommandKey(commands[i])) {
      items[i].key = std::string(*k);
    }
    items[i].args = std::move(commands[i]);
  }
  return items;
}

std::vector<Item> CallItems(std::vector<std::vector<std::string>> calls) {
  std::vector<Item> items(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    int numkeys = 0;
    if (calls[i].size() >= 2 && absl::SimpleAtoi(calls[i][0], &numkeys) && numkeys > 0) {
      items[i].key = calls[i][1];
    }
    items[i].args = std::move(calls[i]);
  }
  return items;
}

absl::StatusOr<std::vector<Reply>> Replies(const absl::Status& st, std::vector<Item>& items) {
  if (!st.ok()) return st;
  std::vector<Reply> out;
  out.reserve(items.size());
  for (Item& it : items) {
    if (!it.reply) return absl::InternalError("redis: a command got no reply");
    out.push_back(std::move(*it.reply));
  }
  return out;
}

std::vector<absl::StatusOr<Reply>> EachReply(std::vector<Item>& items) {
  std::vector<absl::StatusOr<Reply>> out;
  out.reserve(items.size());
  for (Item& it : items) {
    if (!it.status.ok()) {
      out.push_back(it.status);
    } else if (!it.reply) {
      out.push_back(absl::InternalError("redis: a command got no reply"));
    } else {
      out.push_back(std::move(*it.reply));
    }
  }
  return out;
}

void Call::Fail(absl::Span<const size_t> idx, const absl::Status& st) {
  if (!each) {
    if (failed.ok()) failed = st;
    return;
  }
  for (size_t i : idx) {
    items[i].status = st;
    items[i].done = true;
  }
}

}  // namespace bus::redis
