#include "drivers/kafka/internal/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bus/route_key.h"

namespace bus::kafka {
namespace {

constexpr absl::Duration kCommitEvery = absl::Milliseconds(100);
constexpr absl::Duration kFullCommitEvery = absl::Seconds(2);

absl::Status Lost() {
  return absl::FailedPreconditionError(
      "the lease of this Kafka delivery was lost (expired, settled, or its partition was "
      "reassigned)");
}

std::string Str(const void* p, size_t n) {
  return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), n);
}

}  // namespace

absl::StatusOr<std::shared_ptr<Engine>> Engine::Start(std::shared_ptr<Core> core,
                                                      std::string queue) {
  std::shared_ptr<Engine> e(new Engine(std::move(core), std::move(queue)));
  const KafkaOptions& o = e->core_->options();
  absl::StatusOr<Conf> conf = NewConf(o, {{"group.id", e->core_->names().Group(e->queue_)},
                                          {"partition.assignment.strategy", "cooperative-sticky"},
                                          {"enable.auto.commit", "false"},
                                          {"enable.auto.offset.store", "false"},
                                          {"auto.offset.reset", "earliest"},
                                          {"topic.metadata.refresh.interval.ms", "1000"},
                                          {"queued.min.messages", "10000"}});
  if (!conf.ok()) return conf.status();
  rd_kafka_conf_set_rebalance_cb(conf->get(), &Engine::OnRebalance);
  rd_kafka_conf_set_opaque(conf->get(), e.get());
  absl::StatusOr<Handle> rk = NewClient(std::move(*conf), RD_KAFKA_CONSUMER);
  if (!rk.ok()) return rk.status();
  e->rk_ = std::move(*rk);
  rd_kafka_poll_set_consumer(e->rk_.get());
  e->poller_ = std::thread([raw = e.get()] { raw->Run(); });
  return e;
}

Engine::Engine(std::shared_ptr<Core> core, std::string queue)
    : core_(std::move(core)), queue_(std::move(queue)) {}

Engine::~Engine() {
  stop_.store(true);
  if (poller_.joinable()) poller_.join();
}

void Engine::Run() {
  while (!stop_.load()) {
    if (core_->meta().version() != seen_version_) Resubscribe();
    Message m(rd_kafka_consumer_poll(rk_.get(), 20));
    if (m != nullptr && m->err == RD_KAFKA_RESP_ERR_NO_ERROR) OnMessage(m.get());
    Tick();
  }
  PartitionList commits;
  {
    absl::MutexLock lock(&mu_);
    commits = Commits(true);
  }
  CommitSync(commits.get());
  rd_kafka_consumer_close(rk_.get());
}

void Engine::Resubscribe() {
  seen_version_ = core_->meta().version();
  std::vector<Binding> bindings = core_->meta().BindingsOf(queue_);
  // The set only grows while the engine runs: a bus topic whose last binding went stays read
  // (its records then match nothing and are settled at once), which spares the group a
  // rebalance per binding change.
  std::set<std::string> topics(subscribed_.begin(), subscribed_.end());
  topics.insert(core_->names().Queue(queue_));
  for (const std::string& d : core_->DelayTopics(queue_)) topics.insert(d);
  for (const Binding& b : bindings) topics.insert(core_->names().Topic(b.topic));
  {
    absl::MutexLock lock(&mu_);
    bindings_ = std::move(bindings);
  }
  std::vector<std::string> want(topics.begin(), topics.end());
  if (want == subscribed_) return;
  PartitionList list(rd_kafka_topic_partition_list_new(static_cast<int>(want.size())));
  for (const std::string& t : want) {
    rd_kafka_topic_partition_list_add(list.get(), t.c_str(), RD_KAFKA_PARTITION_UA);
  }
  if (rd_kafka_subscribe(rk_.get(), list.get()) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    subscribed_ = std::move(want);
  } else {
    seen_version_ = ~uint64_t{0};  // try again on the next round
  }
}

void Engine::OnRebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t* parts, void* opaque) {
  auto* e = static_cast<Engine*>(opaque);
  const bool cooperative = std::strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    e->Assigned(parts);
    if (cooperative) {
      if (rd_kafka_error_t* error = rd_kafka_incremental_assign(rk, parts)) {
        rd_kafka_error_destroy(error);
      }
    } else {
      rd_kafka_assign(rk, parts);
    }
    return;
  }
  e->Revoked(parts);
  if (cooperative) {
    if (rd_kafka_error_t* error = rd_kafka_incremental_unassign(rk, parts)) {
      rd_kafka_error_destroy(error);
    }
  } else {
    rd_kafka_assign(rk, nullptr);
  }
}

void Engine::Assigned(rd_kafka_topic_partition_list_t* parts) {
  const Names& names = core_->names();
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < parts->cnt; ++i) {
    const std::string topic = parts->elems[i].topic;
    Part part;
    part.epoch = ++next_epoch_;
    if (topic == names.Queue(queue_)) {
      part.kind = Kind::kQueue;
    } else if (absl::StartsWith(topic, names.Topic(""))) {
      part.kind = Kind::kTopic;
      part.bus_topic = topic.substr(names.Topic("").size());
    } else {
      part.kind = Kind::kDelay;
      for (absl::Duration s : core_->options().delay_ladder) {
        if (names.Delay(queue_, s) == topic) part.step = s;
      }
    }
    parts_[{topic, parts->elems[i].partition}] = std::move(part);
  }
}

void Engine::Revoked(rd_kafka_topic_partition_list_t* parts) {
  PartitionList commits(rd_kafka_topic_partition_list_new(parts->cnt));
  {
    absl::MutexLock lock(&mu_);
    std::set<PartKey> gone;
    for (int i = 0; i < parts->cnt; ++i) {
      PartKey key{parts->elems[i].topic, parts->elems[i].partition};
      auto it = parts_.find(key);
      if (it == parts_.end()) continue;
      const int64_t frontier = it->second.offsets.Frontier();
      if (frontier >= 0) {
        rd_kafka_topic_partition_list_add(commits.get(), key.first.c_str(), key.second)->offset =
            frontier;
      }
      parts_.erase(it);
      gone.insert(std::move(key));
    }
    std::erase_if(ready_, [&](const Entry& e) { return gone.count(e.part) > 0; });
    for (auto it = held_.begin(); it != held_.end();) {
      auto next = std::next(it);
      if (gone.count(it->second.entry.part) > 0) {
        auto m = members_.find(it->second.member);
        if (m != members_.end()) --m->second.held;
        held_.erase(it);
      }
      it = next;
    }
    ++wakeups_;
  }
  CommitSync(commits.get());
}

void Engine::CommitSync(rd_kafka_topic_partition_list_t* commits) {
  if (commits == nullptr || commits->cnt == 0) return;
  // A rebalance under way refuses commits for a moment: asked again, within a bound.
  for (int attempt = 0; attempt < 20; ++attempt) {
    const rd_kafka_resp_err_t err = rd_kafka_commit(rk_.get(), commits, 0);
    if (err != RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS &&
        err != RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS &&
        err != RD_KAFKA_RESP_ERR_NOT_COORDINATOR &&
        err != RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE &&
        err != RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT && err != RD_KAFKA_RESP_ERR__TRANSPORT) {
      return;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

Engine::Entry Engine::MakeEntry(const rd_kafka_message_t* m, const Part& part) const {
  Entry e;
  e.part = {rd_kafka_topic_name(m->rkt), m->partition};
  e.epoch = part.epoch;
  e.offset = m->offset;
  e.key = Str(m->key, m->key_len);
  e.value = Str(m->payload, m->len);
  std::string header;
  if (FindHeader(m, kAttemptsHeader, &header) && !absl::SimpleAtoi(header, &e.attempts)) {
    e.attempts = 0;
    e.corrupt = absl::StrCat("the ", kAttemptsHeader, " header is not a number");
  }
  if (e.attempts < 0) e.attempts = 0;
  if (part.kind == Kind::kDelay) {
    int64_t due_ms = 0;
    if (FindHeader(m, kDueHeader, &header) && absl::SimpleAtoi(header, &due_ms)) {
      e.due = absl::FromUnixMillis(due_ms);
    }
    rd_kafka_timestamp_type_t type;
    const int64_t ts = rd_kafka_message_timestamp(m, &type);
    e.step_end = (ts > 0 ? absl::FromUnixMillis(ts) : core_->options().clock->Now()) + part.step;
  }
  return e;
}

void Engine::OnMessage(const rd_kafka_message_t* m) {
  // A binding changed while this record was fetched: match it against the bindings of now (a
  // record sent after Unsubscribe returned must not match the removed binding).
  if (core_->meta().version() != seen_version_) Resubscribe();
  const PartKey key{rd_kafka_topic_name(m->rkt), m->partition};
  std::string route_key;
  const bool has_route = FindHeader(m, kRouteKeyHeader, &route_key);
  absl::MutexLock lock(&mu_);
  auto it = parts_.find(key);
  if (it == parts_.end()) return;
  Part& part = it->second;
  if (part.offsets.Tracks(m->offset) || m->offset < part.offsets.Frontier()) return;
  part.offsets.Fetched(m->offset);
  if (part.kind == Kind::kTopic &&
      !(has_route && Matches(part.bus_topic, m->partition, m->offset, route_key))) {
    part.offsets.Set(m->offset, PartitionOffsets::kSettled);
    return;
  }
  Entry e = MakeEntry(m, part);
  if (part.kind == Kind::kDelay) {
    part.waiting.push_back(std::move(e));
  } else {
    ready_.push_back(std::move(e));
  }
}

bool Engine::Matches(const std::string& bus_topic, int32_t partition, int64_t offset,
                     absl::string_view route_key) const {
  for (const Binding& b : bindings_) {
    if (b.topic != bus_topic) continue;
    const size_t p = static_cast<size_t>(partition);
    const int64_t start = p < b.start.size() ? b.start[p] : 0;
    if (offset >= start && RouteKeyMatches(b.key, route_key)) return true;
  }
  return false;
}

void Engine::Tick() {
  const absl::Time now = core_->options().clock->Now();
  std::vector<Entry> forward;
  PartitionList commits;
  {
    absl::MutexLock lock(&mu_);
    forward = ReleaseDelayed(now);
    ApplyFlow();
    if (now - last_commit_ >= kCommitEvery) {
      const bool all = now - last_full_commit_ >= kFullCommitEvery;
      commits = Commits(all);
      last_commit_ = now;
      if (all) last_full_commit_ = now;
    }
  }
  for (Entry& e : forward) Forward(std::move(e));
  if (commits != nullptr && commits->cnt > 0) rd_kafka_commit(rk_.get(), commits.get(), 1);
}

void Engine::ExpireLeases(absl::Time now) {
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    if (it->second.deadline <= now) {
      auto m = members_.find(it->second.member);
      if (m != members_.end()) --m->second.held;
      Requeue(std::move(it->second.entry), /*front=*/true);
      held_.erase(it);
    }
    it = next;
  }
}

std::vector<Engine::Entry> Engine::ReleaseDelayed(absl::Time now) {
  std::vector<Entry> forward;
  for (auto& [key, part] : parts_) {
    if (part.kind != Kind::kDelay) continue;
    while (!part.waiting.empty()) {
      Entry& head = part.waiting.front();
      if (head.due <= now) {
        ready_.push_back(std::move(head));
      } else if (head.step_end <= now) {
        forward.push_back(std::move(head));
      } else {
        break;
      }
      part.waiting.pop_front();
    }
  }
  return forward;
}

void Engine::Forward(Entry e) {
  absl::Status st = core_->SendDelayed(queue_, e.key, e.value, e.attempts, e.due);
  absl::MutexLock lock(&mu_);
  if (st.ok()) {
    SetState(e, PartitionOffsets::kSettled);
    return;
  }
  auto it = parts_.find(e.part);
  if (it != parts_.end() && it->second.epoch == e.epoch) {
    e.step_end = core_->options().clock->Now() + core_->options().backoff.max;
    it->second.waiting.push_front(std::move(e));
  }
}

void Engine::ApplyFlow() {
  int cap = 0;
  for (const auto& [id, m] : members_) cap += m.max_held;
  // Paused while no consumer may take anything (SetIntake(0)); else a prefetch of several
  // consumers' worth, so that a resume (a new fetch) is rare.
  const bool full = cap == 0 || static_cast<int>(ready_.size()) >= std::max(4 * cap, 2000);
  PartitionList pause(rd_kafka_topic_partition_list_new(4));
  PartitionList resume(rd_kafka_topic_partition_list_new(4));
  for (auto& [key, part] : parts_) {
    const bool want = part.kind == Kind::kDelay ? !part.waiting.empty() : full;
    if (want == part.paused) continue;
    part.paused = want;
    rd_kafka_topic_partition_list_add(want ? pause.get() : resume.get(), key.first.c_str(),
                                      key.second);
  }
  if (pause->cnt > 0) rd_kafka_pause_partitions(rk_.get(), pause.get());
  if (resume->cnt > 0) rd_kafka_resume_partitions(rk_.get(), resume.get());
}

PartitionList Engine::Commits(bool all) {
  PartitionList list(rd_kafka_topic_partition_list_new(static_cast<int>(parts_.size())));
  for (auto& [key, part] : parts_) {
    const bool dirty = part.offsets.TakeDirty();
    const int64_t frontier = part.offsets.Frontier();
    if ((!dirty && !all) || frontier < 0) continue;
    rd_kafka_topic_partition_t* tp =
        rd_kafka_topic_partition_list_add(list.get(), key.first.c_str(), key.second);
    tp->offset = frontier;
    const std::string meta = part.offsets.Metadata();
    if (!meta.empty()) {
      tp->metadata = std::malloc(meta.size());
      std::memcpy(tp->metadata, meta.data(), meta.size());
      tp->metadata_size = meta.size();
    }
  }
  return list;
}

void Engine::SetState(const Entry& e, PartitionOffsets::State state) {
  auto it = parts_.find(e.part);
  if (it != parts_.end() && it->second.epoch == e.epoch) it->second.offsets.Set(e.offset, state);
}

void Engine::Requeue(Entry e, bool front) {
  auto it = parts_.find(e.part);
  if (it == parts_.end() || it->second.epoch != e.epoch) return;  // revoked meanwhile
  it->second.offsets.Set(e.offset, PartitionOffsets::kWaiting);
  if (front) {
    ready_.push_front(std::move(e));
  } else {
    ready_.push_back(std::move(e));
  }
}

int Engine::Join(const ConsumerOptions& options) {
  absl::MutexLock lock(&mu_);
  const int id = ++next_member_;
  members_[id] = Member{.max_held = options.max_in_flight, .lease = options.lease};
  return id;
}

void Engine::Leave(int member) {
  absl::MutexLock lock(&mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    if (it->second.member == member) {
      Requeue(std::move(it->second.entry), /*front=*/true);
      held_.erase(it);
    }
    it = next;
  }
  members_.erase(member);
}

int Engine::Room(int member) const {
  auto it = members_.find(member);
  return it == members_.end() ? 0 : it->second.max_held - it->second.held;
}

absl::Status Engine::Receive(int member, int max, absl::Duration wait, std::stop_token stop,
                             std::vector<Delivery>* out) {
  std::stop_callback wake(stop, [this] {
    absl::MutexLock lock(&mu_);
    ++wakeups_;
  });
  const Clock& clock = *core_->options().clock;
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = clock.Now() + wait;
  for (;;) {
    const absl::Time now = clock.Now();
    ExpireLeases(now);
    const int room = std::min(max, Room(member));
    if (room > 0 && !ready_.empty()) {
      Member& m = members_[member];
      for (int i = 0; i < room && !ready_.empty(); ++i) {
        Entry e = std::move(ready_.front());
        ready_.pop_front();
        ++e.attempts;
        SetState(e, PartitionOffsets::kHeld);
        const uint64_t id = ++next_id_;
        out->push_back(Delivery{.data = e.value,
                                .receipt = absl::StrCat(id),
                                .attempts = e.attempts,
                                .corrupt = e.corrupt});
        held_[id] = Held{.entry = std::move(e), .member = member, .deadline = now + m.lease};
        ++m.held;
      }
      return absl::OkStatus();
    }
    if (stop.stop_requested() || now >= deadline) return absl::OkStatus();
    absl::Time wake_at = deadline;
    for (const auto& [id, h] : held_) wake_at = std::min(wake_at, h.deadline);
    const uint64_t wakeups = wakeups_;
    auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return wakeups_ != wakeups || (Room(member) > 0 && !ready_.empty());
    };
    clock.AwaitWithDeadline(&mu_, absl::Condition(&changed), wake_at);
  }
}

absl::StatusOr<Engine::Held> Engine::Take(int member, absl::string_view receipt) {
  uint64_t id = 0;
  if (!absl::SimpleAtoi(receipt, &id)) return Lost();
  auto it = held_.find(id);
  if (it == held_.end() || it->second.member != member) return Lost();
  Held h = std::move(it->second);
  held_.erase(it);
  auto m = members_.find(member);
  if (m != members_.end()) --m->second.held;
  return h;
}

absl::Status Engine::Ack(int member, absl::string_view receipt) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Held> h = Take(member, receipt);
  if (!h.ok()) return h.status();
  SetState(h->entry, PartitionOffsets::kSettled);
  return absl::OkStatus();
}

absl::Status Engine::Nack(int member, absl::string_view receipt, absl::Duration delay) {
  absl::StatusOr<Held> h;
  {
    absl::MutexLock lock(&mu_);
    h = Take(member, receipt);
    if (!h.ok()) return h.status();
    if (delay <= absl::ZeroDuration()) {
      Requeue(std::move(h->entry), /*front=*/false);
      return absl::OkStatus();
    }
  }
  const absl::Time due = core_->options().clock->Now() + delay;
  absl::Status st =
      core_->SendDelayed(queue_, h->entry.key, h->entry.value, h->entry.attempts, due);
  absl::MutexLock lock(&mu_);
  if (st.ok()) {
    SetState(h->entry, PartitionOffsets::kSettled);
  } else {
    Requeue(std::move(h->entry), /*front=*/false);
  }
  return st;
}

absl::Status Engine::Extend(int member, absl::string_view receipt) {
  uint64_t id = 0;
  if (!absl::SimpleAtoi(receipt, &id)) return Lost();
  absl::MutexLock lock(&mu_);
  auto it = held_.find(id);
  const absl::Time now = core_->options().clock->Now();
  if (it == held_.end() || it->second.member != member) return Lost();
  it->second.deadline = now + members_[member].lease;
  return absl::OkStatus();
}

void Engine::SetIntake(int member, int max_held) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(member);
  if (it != members_.end()) it->second.max_held = std::max(0, max_held);
  ++wakeups_;
}

bool Engine::View(const std::string& topic, int partition, int64_t* from, std::string* states) {
  absl::MutexLock lock(&mu_);
  auto it = parts_.find({topic, partition});
  if (it == parts_.end() || it->second.offsets.Frontier() < 0) return false;
  *from = it->second.offsets.Frontier();
  *states = it->second.offsets.Metadata();
  return true;
}

}  // namespace bus::kafka
