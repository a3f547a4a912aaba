#include "drivers/kafka/internal/meta.h"

#include <unistd.h>

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bus/backoff.h"

namespace bus::kafka {
namespace {

constexpr char kSep = '\x1f';

std::string BindingKey(const std::string& topic, const std::string& queue, const std::string& key) {
  return absl::StrCat("b", std::string(1, kSep), topic, std::string(1, kSep), queue,
                      std::string(1, kSep), key);
}

std::string DelayKey(const std::string& queue) {
  return absl::StrCat("d", std::string(1, kSep), queue);
}

// "b<sep>topic<sep>queue<sep>key" -> binding without starts.
std::optional<Binding> ParseBindingKey(absl::string_view k) {
  if (k.size() < 2 || k[0] != 'b' || k[1] != kSep) return std::nullopt;
  k.remove_prefix(2);
  const size_t a = k.find(kSep);
  if (a == absl::string_view::npos) return std::nullopt;
  const size_t b = k.find(kSep, a + 1);
  if (b == absl::string_view::npos) return std::nullopt;
  Binding out;
  out.topic = std::string(k.substr(0, a));
  out.queue = std::string(k.substr(a + 1, b - a - 1));
  out.key = std::string(k.substr(b + 1));
  return out;
}

std::vector<int64_t> ParseStarts(absl::string_view payload) {
  std::vector<int64_t> out;
  if (payload.empty()) return out;
  for (absl::string_view part : absl::StrSplit(payload, ',')) {
    int64_t v = 0;
    out.push_back(absl::SimpleAtoi(part, &v) ? v : 0);
  }
  return out;
}

}  // namespace

MetaStore::MetaStore(const KafkaOptions& options, Producer* producer, Admin* admin)
    : options_(options),
      names_(options.prefix),
      producer_(producer),
      admin_(admin),
      instance_(absl::StrCat(getpid(), ".", absl::Uniform<uint64_t>(absl::BitGen()))) {
  reader_ = std::thread([this] { ReadLoop(); });
}

MetaStore::~MetaStore() {
  stop_.store(true);
  reader_.join();
}

absl::Status MetaStore::EnsureTopic() {
  {
    absl::MutexLock lock(&mu_);
    if (topic_made_) return absl::OkStatus();
  }
  absl::Status st =
      admin_->CreateTopics({TopicSpec{.name = names_.Meta(),
                                      .partitions = 1,
                                      .replication_factor = options_.topics.replication_factor,
                                      .compacted = true}});
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  topic_made_ = true;
  return absl::OkStatus();
}

absl::Status MetaStore::Write(const std::string& key, std::optional<std::string> payload) {
  if (absl::Status st = EnsureTopic(); !st.ok()) return st;
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = absl::StrCat(instance_, ".", ++seq_);
  }
  const std::string value = absl::StrCat(token, "|", payload ? "+" + *payload : "-");
  OutRecord r{.topic = names_.Meta(), .key = key, .value = value};
  if (absl::Status st = producer_->Send({&r, 1}); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[key];
  e.payload = std::move(payload);
  e.pending_token = token;
  version_.fetch_add(1);
  return absl::OkStatus();
}

void MetaStore::Apply(const std::string& key, absl::string_view value) {
  const size_t bar = value.find('|');
  if (bar == absl::string_view::npos || bar + 1 >= value.size()) return;
  const absl::string_view token = value.substr(0, bar);
  const absl::string_view body = value.substr(bar + 1);
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[key];
  if (!e.pending_token.empty()) {
    if (token != e.pending_token) return;  // older than this instance's own write
    e.pending_token.clear();
  }
  if (body[0] == '+') {
    e.payload = std::string(body.substr(1));
  } else {
    e.payload.reset();
  }
  version_.fetch_add(1);
}

void MetaStore::ReadLoop() {
  Backoff backoff(options_.backoff);
  Handle rk;
  while (!stop_.load()) {
    if (rk == nullptr) {
      absl::StatusOr<Conf> conf =
          NewConf(options_, {{"group.id", names_.Reader()}, {"enable.auto.commit", "false"}});
      // The topic need not exist yet: the reader waits for it (the first write makes it).
      absl::StatusOr<Handle> made =
          conf.ok() ? NewClient(std::move(*conf), RD_KAFKA_CONSUMER) : conf.status();
      if (made.ok()) {
        PartitionList list(rd_kafka_topic_partition_list_new(1));
        rd_kafka_topic_partition_list_add(list.get(), names_.Meta().c_str(), 0)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
        rd_kafka_assign(made->get(), list.get());
        rk = std::move(*made);
        backoff.Reset();
      } else {
        const absl::Time until = absl::Now() + backoff.Next();
        while (!stop_.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
    }
    Message m(rd_kafka_consumer_poll(rk.get(), 50));
    if (m == nullptr || m->err != RD_KAFKA_RESP_ERR_NO_ERROR || m->key == nullptr ||
        m->payload == nullptr) {
      continue;
    }
    Apply(std::string(static_cast<const char*>(m->key), m->key_len),
          absl::string_view(static_cast<const char*>(m->payload), m->len));
  }
  if (rk != nullptr) rd_kafka_consumer_close(rk.get());
}

absl::Status MetaStore::PutBinding(const Binding& b) {
  return Write(BindingKey(b.topic, b.queue, b.key), absl::StrJoin(b.start, ","));
}

absl::Status MetaStore::RemoveBinding(const std::string& topic, const std::string& queue,
                                      const std::string& key) {
  return Write(BindingKey(topic, queue, key), std::nullopt);
}

absl::Status MetaStore::PutDelay(const std::string& queue, absl::Duration delay) {
  return Write(DelayKey(queue), absl::StrCat(absl::ToInt64Milliseconds(delay)));
}

absl::Status MetaStore::RemoveDelay(const std::string& queue) {
  return Write(DelayKey(queue), std::nullopt);
}

std::optional<Binding> MetaStore::FindBinding(const std::string& topic, const std::string& queue,
                                              const std::string& key) const {
  const std::string k = BindingKey(topic, queue, key);
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(k);
  if (it == entries_.end() || !it->second.payload) return std::nullopt;
  std::optional<Binding> b = ParseBindingKey(k);
  if (b) b->start = ParseStarts(*it->second.payload);
  return b;
}

std::vector<Binding> MetaStore::BindingsOf(const std::string& queue) const {
  std::vector<Binding> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [k, e] : entries_) {
    if (!e.payload) continue;
    std::optional<Binding> b = ParseBindingKey(k);
    if (!b || b->queue != queue) continue;
    b->start = ParseStarts(*e.payload);
    out.push_back(std::move(*b));
  }
  return out;
}

absl::Duration MetaStore::DelayOf(const std::string& queue) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(DelayKey(queue));
  int64_t ms = 0;
  if (it == entries_.end() || !it->second.payload || !absl::SimpleAtoi(*it->second.payload, &ms)) {
    return absl::ZeroDuration();
  }
  return absl::Milliseconds(ms);
}

}  // namespace bus::kafka
