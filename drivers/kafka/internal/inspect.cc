#include "drivers/kafka/internal/inspect.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "bus/route_key.h"
#include "drivers/kafka/internal/offsets.h"

namespace bus::kafka {

Inspector::Inspector(std::shared_ptr<Core> core) : core_(std::move(core)) {
  // Made now (it connects in the background), so that the first inspection does not wait.
  absl::MutexLock lock(&mu_);
  StartReader().IgnoreError();
}

absl::Status Inspector::StartReader() {
  absl::StatusOr<Conf> conf = NewConf(core_->options(), {{"group.id", core_->names().Reader()},
                                                         {"enable.auto.commit", "false"},
                                                         {"fetch.wait.max.ms", "10"},
                                                         {"fetch.error.backoff.ms", "10"}});
  if (!conf.ok()) return conf.status();
  absl::StatusOr<Handle> rk = NewClient(std::move(*conf), RD_KAFKA_CONSUMER);
  if (!rk.ok()) return rk.status();
  reader_ = std::move(*rk);
  return absl::OkStatus();
}

Inspector::~Inspector() {
  absl::MutexLock lock(&mu_);
  if (reader_ != nullptr) rd_kafka_consumer_close(reader_.get());
}

absl::StatusOr<std::vector<std::string>> Inspector::ListQueues() {
  absl::StatusOr<std::map<std::string, int>> topics = core_->admin().Topics(true);
  if (!topics.ok()) return topics.status();
  std::vector<std::string> out;
  for (const auto& [name, partitions] : *topics) {
    if (std::optional<std::string> q = core_->names().QueueOf(name)) out.push_back(*q);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<Inspector::Range>> Inspector::Ranges(const std::string& topic,
                                                                const std::string& group,
                                                                Engine* engine) {
  absl::StatusOr<std::map<std::string, int>> meta = core_->admin().Topics(false, topic);
  if (absl::IsNotFound(meta.status())) return std::vector<Range>{};
  if (!meta.ok()) return meta.status();
  const int n = meta->at(topic);
  absl::StatusOr<std::vector<Committed>> committed =
      core_->admin().CommittedOffsets(group, topic, n);
  if (!committed.ok()) return committed.status();
  std::vector<Range> out;
  for (int p = 0; p < n; ++p) {
    Range r{.topic = topic, .partition = p};
    int64_t low = 0;
    if (absl::Status st = core_->admin().Watermarks(topic, p, &low, &r.to); !st.ok()) return st;
    const Committed& c = (*committed)[static_cast<size_t>(p)];
    r.committed = true;
    if (engine == nullptr || !engine->View(topic, p, &r.from, &r.states)) {
      r.committed = c.offset >= 0;
      r.from = r.committed ? c.offset : low;
      r.states = r.committed ? c.metadata : "";
    }
    r.from = std::max(r.from, low);
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status Inspector::Scan(const Range& range,
                             const std::function<bool(const rd_kafka_message_t*)>& fn) {
  if (range.from >= range.to) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (reader_ == nullptr) {
    if (absl::Status st = StartReader(); !st.ok()) return st;
  }
  PartitionList list(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(list.get(), range.topic.c_str(), range.partition)->offset =
      range.from;
  rd_kafka_assign(reader_.get(), list.get());
  const absl::Time deadline = absl::Now() + core_->options().timeouts.request;
  absl::Status result = absl::UnavailableError("reading Kafka topic " + range.topic + " timed out");
  while (absl::Now() < deadline) {
    Message m(rd_kafka_consumer_poll(reader_.get(), 100));
    if (m == nullptr || m->err != RD_KAFKA_RESP_ERR_NO_ERROR || m->partition != range.partition ||
        range.topic != rd_kafka_topic_name(m->rkt) || m->offset < range.from) {
      continue;
    }
    if (m->offset >= range.to || !fn(m.get()) || m->offset + 1 >= range.to) {
      result = absl::OkStatus();
      break;
    }
  }
  rd_kafka_assign(reader_.get(), nullptr);
  return result;
}

absl::StatusOr<QueueCounts> Inspector::Counts(const std::string& queue, Engine* engine) {
  const Names& names = core_->names();
  const std::string group = names.Group(queue);
  QueueCounts counts{.queue = queue};
  absl::StatusOr<std::vector<Range>> ranges = Ranges(names.Queue(queue), group, engine);
  if (!ranges.ok()) return ranges.status();
  if (ranges->empty()) return counts;  // a queue Kafka does not know
  for (const Range& r : *ranges) {
    const StateCounts s = CountStates(r.states);
    counts.in_flight += s.held;
    counts.ready += std::max<int64_t>(0, r.to - r.from - s.held - s.settled);
  }
  const absl::Time now = core_->options().clock->Now();
  for (const std::string& topic : core_->DelayTopics(queue)) {
    ranges = Ranges(topic, group, engine);
    if (!ranges.ok()) return ranges.status();
    for (const Range& r : *ranges) {
      absl::Status st = Scan(r, [&](const rd_kafka_message_t* m) {
        const PartitionOffsets::State state = StateAt(r.states, r.from, m->offset);
        std::string due;
        int64_t due_ms = 0;
        if (state == PartitionOffsets::kHeld) {
          ++counts.in_flight;
        } else if (state == PartitionOffsets::kWaiting) {
          const bool has = FindHeader(m, kDueHeader, &due) && absl::SimpleAtoi(due, &due_ms);
          ++(has && absl::FromUnixMillis(due_ms) > now ? counts.delayed : counts.ready);
        }
        return true;
      });
      if (!st.ok()) return st;
    }
  }
  std::vector<Binding> bindings = core_->meta().BindingsOf(queue);
  std::set<std::string> topics;
  for (const Binding& b : bindings) topics.insert(b.topic);
  for (const std::string& topic : topics) {
    ranges = Ranges(names.Topic(topic), group, engine);
    if (!ranges.ok()) return ranges.status();
    for (Range r : *ranges) {
      if (!r.committed) {  // nothing committed: from the earliest binding
        int64_t start = r.to;
        for (const Binding& b : bindings) {
          const size_t p = static_cast<size_t>(r.partition);
          if (b.topic == topic) start = std::min(start, p < b.start.size() ? b.start[p] : 0);
        }
        r.from = std::max(start, r.from);
      }
      absl::Status st = Scan(r, [&](const rd_kafka_message_t* m) {
        const PartitionOffsets::State state = StateAt(r.states, r.from, m->offset);
        std::string rk;
        if (state == PartitionOffsets::kHeld) ++counts.in_flight;
        if (state != PartitionOffsets::kWaiting || !FindHeader(m, kRouteKeyHeader, &rk)) {
          return true;
        }
        for (const Binding& b : bindings) {
          const size_t p = static_cast<size_t>(r.partition);
          const int64_t start = p < b.start.size() ? b.start[p] : 0;
          if (b.topic == topic && m->offset >= start && RouteKeyMatches(b.key, rk)) {
            ++counts.ready;
            break;
          }
        }
        return true;
      });
      if (!st.ok()) return st;
    }
  }
  return counts;
}

absl::StatusOr<std::optional<std::string>> Inspector::Peek(const std::string& queue,
                                                           Engine* engine) {
  absl::StatusOr<std::vector<Range>> ranges =
      Ranges(core_->names().Queue(queue), core_->names().Group(queue), engine);
  if (!ranges.ok()) return ranges.status();
  std::optional<std::string> found;
  for (const Range& r : *ranges) {
    absl::Status st = Scan(r, [&](const rd_kafka_message_t* m) {
      if (StateAt(r.states, r.from, m->offset) != PartitionOffsets::kWaiting) return true;
      found = m->payload == nullptr ? std::string()
                                    : std::string(static_cast<const char*>(m->payload), m->len);
      return false;
    });
    if (!st.ok()) return st;
    if (found) return found;
  }
  return found;
}

}  // namespace bus::kafka
