#include "drivers/nats/internal/core.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace bus::nats {
namespace {

using nlohmann::json;

constexpr char kDelayKey[] = "bus_delay_ms";
constexpr char kBindingsKey[] = "bus_bindings";
constexpr char kLeaseKey[] = "bus_lease_ms";

int64_t Nanos(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

}  // namespace

Core::Core(std::unique_ptr<Client> client, NatsOptions options)
    : client_(std::move(client)),
      options_(std::move(options)),
      subjects_(options_.stream.subject_prefix),
      clock_(options_.clock ? options_.clock : RealClock()) {}

absl::Status Core::EnsureStream() {
  const std::string& name = options_.stream.name;
  json config = {
      {"name", name},
      {"subjects", json::array({subjects_.All()})},
      {"retention", "interest"},
      {"storage",
       options_.stream.storage == NatsOptions::Stream::Storage::kMemory ? "memory" : "file"},
      {"num_replicas", options_.stream.replicas},
      {"discard", "old"},
      {"allow_msg_schedules", true},
      {"allow_rollup_hdrs", true},
      {"duplicate_window", Nanos(absl::Minutes(2))},
  };
  absl::StatusOr<json> created = client_->Api(absl::StrCat("STREAM.CREATE.", name), config);
  if (!created.ok()) {
    // A stream made by another client (or by an operator, with other limits) is used as it is.
    absl::StatusOr<json> info = client_->Api(absl::StrCat("STREAM.INFO.", name), json());
    if (!info.ok()) return created.status();
  }
  json holder = {
      {"stream_name", name},
      {"config",
       {{"durable_name", std::string(Subjects::kScheduleHolder)},
        {"deliver_policy", "new"},
        {"ack_policy", "explicit"},
        {"filter_subject", subjects_.AllDelayed()}}},
  };
  absl::StatusOr<json> made =
      client_->Api(absl::StrCat("CONSUMER.CREATE.", name, ".", Subjects::kScheduleHolder), holder);
  return made.ok() ? absl::OkStatus() : made.status();
}

absl::StatusOr<QueueState> Core::ReadQueue(const std::string& queue) {
  absl::StatusOr<json> info = client_->Api(
      absl::StrCat("CONSUMER.INFO.", options_.stream.name, ".", Subjects::ConsumerName(queue)),
      json());
  if (!info.ok()) return info.status();
  QueueState state;
  const json& config = (*info)["config"];
  const json metadata = config.value("metadata", json::object());
  int64_t ms = 0;
  if (absl::SimpleAtoi(metadata.value(kDelayKey, std::string("0")), &ms)) {
    state.delay = absl::Milliseconds(ms);
  }
  if (absl::SimpleAtoi(metadata.value(kLeaseKey, std::string("0")), &ms)) {
    state.lease = absl::Milliseconds(ms);
  }
  json bindings = json::parse(metadata.value(kBindingsKey, std::string("[]")), nullptr, false);
  if (bindings.is_array()) {
    for (const json& b : bindings) {
      if (b.is_array() && b.size() == 2) state.bindings.emplace(b[0], b[1]);
    }
  }
  state.num_pending = info->value("num_pending", int64_t{0});
  state.num_ack_pending = info->value("num_ack_pending", int64_t{0});
  state.num_redelivered = info->value("num_redelivered", int64_t{0});
  state.delivered_stream_seq = (*info)["delivered"].value("stream_seq", uint64_t{0});
  return state;
}

std::vector<std::string> Core::Filters(const std::string& queue, const QueueState& state) const {
  std::vector<std::string> filters = {subjects_.Queue(queue)};
  std::map<std::string, std::vector<std::string>> keys;
  for (const auto& [topic, key] : state.bindings) keys[topic].push_back(key);
  for (const auto& [topic, list] : keys) {
    std::optional<std::vector<std::string>> exact;
    if (list.size() == 1) exact = subjects_.BindingFilters(topic, list[0]);
    const std::vector<std::string> add = exact ? *exact : subjects_.TopicWide(topic);
    filters.insert(filters.end(), add.begin(), add.end());
  }
  return filters;
}

std::set<std::string> Core::MatcherTopics(const QueueState& state) const {
  std::map<std::string, std::vector<std::string>> keys;
  for (const auto& [topic, key] : state.bindings) keys[topic].push_back(key);
  std::set<std::string> out;
  for (const auto& [topic, list] : keys) {
    if (list.size() > 1 || !subjects_.BindingFilters(topic, list[0])) out.insert(topic);
  }
  return out;
}

absl::Status Core::WriteQueue(const std::string& queue, const QueueState& state) {
  json bindings = json::array();
  for (const auto& [topic, key] : state.bindings) bindings.push_back({topic, key});
  const std::string name = Subjects::ConsumerName(queue);
  json config = {
      {"durable_name", name},
      {"deliver_policy", "new"},
      {"ack_policy", "explicit"},
      {"ack_wait", Nanos(state.lease > absl::ZeroDuration() ? state.lease : absl::Seconds(30))},
      {"max_deliver", options_.max_deliver == 0 ? -1 : options_.max_deliver},
      {"filter_subjects", Filters(queue, state)},
      {"max_waiting", 512},
      {"metadata",
       {{kDelayKey, absl::StrCat(absl::ToInt64Milliseconds(state.delay))},
        {kLeaseKey, absl::StrCat(absl::ToInt64Milliseconds(state.lease))},
        {kBindingsKey, bindings.dump()}}},
  };
  absl::StatusOr<json> made =
      client_->Api(absl::StrCat("CONSUMER.CREATE.", options_.stream.name, ".", name),
                   json{{"stream_name", options_.stream.name}, {"config", config}});
  if (!made.ok()) return made.status();
  Remember(queue, state.delay);
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> Core::EnsureQueue(const std::string& queue) {
  {
    absl::MutexLock lock(&mu_);
    auto it = known_.find(queue);
    if (it != known_.end()) return it->second;
  }
  absl::StatusOr<QueueState> state = ReadQueue(queue);
  if (absl::IsNotFound(state.status())) {
    state = QueueState{};
    if (absl::Status st = WriteQueue(queue, *state); !st.ok()) return st;
  }
  if (!state.ok()) return state.status();
  Remember(queue, state->delay);
  return state->delay;
}

void Core::Forget(const std::string& queue) {
  absl::MutexLock lock(&mu_);
  known_.erase(queue);
}

void Core::Remember(const std::string& queue, absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  known_[queue] = delay;
}

}  // namespace bus::nats
