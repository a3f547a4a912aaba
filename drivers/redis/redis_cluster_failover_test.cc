// A failover with a lagging replica on a Redis Cluster (3 masters, one replica each), with the
// Redis Cluster idempotency and dead-letter stores at wait_replicas = 1. The replica of a master
// is stopped (SIGSTOP) and its link dropped (CLIENT KILL TYPE replica), so writes on that master
// are acknowledged by the master alone; the master is then SIGKILLed and the stale replica
// promoted (CLUSTER FAILOVER TAKEOVER). A store write that only the master had must not have been
// reported OK: no done-mark reported OK is lost, and a Handler consuming through the failover
// repeats no effect. Each test starts its own cluster; every wait is on state a node reports
// (INFO replication, ROLE), never on a fixed sleep.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bus/handler.h"
#include "bus/logger.h"
#include "bus/publisher.h"
#include "drivers/redis/redis_driver.h"
#include "gtest/gtest.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "tests/testing/letters.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

// A numeric field of INFO replication on `node`; -1 when the node does not answer.
int64_t ReplicationField(const RedisCluster& c, int node, absl::string_view field) {
  absl::StatusOr<std::string> info = c.Cli(node, {"INFO", "replication"});
  if (!info.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*info, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(line, ':');
    int64_t v = 0;
    if (kv.first == field && absl::SimpleAtoi(absl::StripAsciiWhitespace(kv.second), &v)) return v;
  }
  return -1;
}

// Makes `master`'s replica a lagging one: stopped, and its link dropped, so the master has no
// replica to acknowledge a write (connected_slaves:0). Returns the replica's node index.
absl::StatusOr<int> StopReplicaOf(RedisCluster& c, int master) {
  absl::StatusOr<int> replica = c.ReplicaOf(master);
  if (!replica.ok()) return replica.status();
  c.Pause(*replica);
  absl::StatusOr<std::string> killed = c.Cli(master, {"CLIENT", "KILL", "TYPE", "replica"});
  if (!killed.ok()) return killed.status();
  if (!WaitUntil([&] { return ReplicationField(c, master, "connected_slaves") == 0; })) {
    return absl::DeadlineExceededError("the master kept its replica link");
  }
  return *replica;
}

// SIGKILLs `master`, lets its stopped replica run again and promotes it; the old master then
// comes back as the new master's replica (resynced from it, so what only it had is gone), since
// writes at wait_replicas = 1 need a replica.
absl::Status FailOverToStaleReplica(RedisCluster& c, int master, int replica) {
  c.Kill(master);
  c.Resume(replica);
  // The replica may already have started a failover of its own once it saw the master fail;
  // either way it must end up master.
  if (absl::Status st = c.Takeover(replica);
      !st.ok() && c.RoleOf(replica) != RedisCluster::Role::kMaster) {
    return st;
  }
  if (absl::Status st = c.Restart(master); !st.ok()) return st;
  return c.WaitHealthy();
}

RedisOptions ClusterOptions(const RedisCluster& c) {
  RedisOptions o;
  o.seeds = c.Seeds();
  o.replication.wait_replicas = 1;
  // Long enough for a replica on shared, loaded cores; each write on a master without its
  // replica then takes this long to fail.
  o.replication.wait_timeout = absl::Seconds(1);
  o.timeouts.request = absl::Seconds(2);
  o.logger = NullLogger();
  return o;
}

// A name whose hash tag lands on `master` (or not, with `on` false).
std::string NameOn(const RedisCluster& c, absl::string_view base, int master, bool on = true) {
  for (int i = 0;; ++i) {
    std::string name = absl::StrCat(base, i);
    absl::StatusOr<int> slot = c.KeySlot(name);
    if (slot.ok() && (*c.MasterOfSlot(*slot) == master) == on) return name;
  }
}

// Records the message ids whose mark-done failed (event "mark_done_failed") and the errors.
class MarkDoneFailures final : public Logger {
 public:
  void Write(const LogRecord& r) override {
    absl::MutexLock lock(&mu_);
    all_[std::string(r.message_id)].push_back(FormatLogLine(r));
    if (r.event != "mark_done_failed") return;
    ids_.emplace(r.message_id, r.error);
  }
  std::vector<std::string> of(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return all_[id];
  }
  absl::flat_hash_map<std::string, std::string> ids() {
    absl::MutexLock lock(&mu_);
    return ids_;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<std::string>> all_ ABSL_GUARDED_BY(mu_);
};

// Forwards to a store and keeps, per key, each call and its outcome (for a failure message).
class TracingIdempotencyStore final : public IdempotencyStore {
 public:
  explicit TracingIdempotencyStore(std::shared_ptr<IdempotencyStore> base)
      : base_(std::move(base)) {}
  absl::StatusOr<bool> Acquire(absl::string_view k, absl::string_view o,
                               absl::Duration lease) override {
    absl::StatusOr<bool> r = base_->Acquire(k, o, lease);
    Note(k, absl::StrCat("acquire ", o, " -> ",
                         r.ok() ? (*r ? "true" : "false") : r.status().ToString()));
    return r;
  }
  absl::Status MarkDone(absl::string_view k, absl::string_view o, absl::Duration r) override {
    absl::Status st = base_->MarkDone(k, o, r);
    Note(k, absl::StrCat("mark-done ", o, " -> ", st.ToString()));
    return st;
  }
  absl::Status Release(absl::string_view k, absl::string_view o) override {
    absl::Status st = base_->Release(k, o);
    Note(k, absl::StrCat("release ", o, " -> ", st.ToString()));
    return st;
  }
  void AcquireMany(absl::Span<const absl::string_view> keys,
                   absl::Span<const absl::string_view> owners, absl::Duration lease,
                   absl::Span<absl::StatusOr<bool>> results) override {
    base_->AcquireMany(keys, owners, lease, results);
    for (size_t i = 0; i < keys.size(); ++i) {
      Note(keys[i], absl::StrCat("acquire* ", owners[i], " -> ",
                                 results[i].ok() ? (*results[i] ? "true" : "false")
                                                 : results[i].status().ToString()));
    }
  }
  void MarkDoneMany(absl::Span<const absl::string_view> keys,
                    absl::Span<const absl::string_view> owners, absl::Duration retention,
                    absl::Span<absl::Status> results) override {
    base_->MarkDoneMany(keys, owners, retention, results);
    for (size_t i = 0; i < keys.size(); ++i) {
      Note(keys[i], absl::StrCat("mark-done* ", owners[i], " -> ", results[i].ToString()));
    }
  }
  std::optional<int> ReplicasAwaited() const override { return base_->ReplicasAwaited(); }
  void FollowReplicas(int replicas) override { base_->FollowReplicas(replicas); }
  std::vector<std::string> Of(absl::string_view key) {
    absl::MutexLock lock(&mu_);
    return calls_[key];
  }

 private:
  void Note(absl::string_view key, std::string what) {
    absl::MutexLock lock(&mu_);
    calls_[key].push_back(std::move(what));
  }
  std::shared_ptr<IdempotencyStore> base_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<std::string>> calls_ ABSL_GUARDED_BY(mu_);
};

TEST(RedisClusterLaggingReplicaTest, NoDoneMarkReportedOkIsLost) {
  absl::StatusOr<std::unique_ptr<RedisCluster>> cluster = RedisCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RedisCluster& c = **cluster;
  const RedisOptions o = ClusterOptions(c);
  std::shared_ptr<IdempotencyStore> idem = *NewRedisIdempotencyStore(o);
  std::shared_ptr<DeadLetterStore> dlq = *NewRedisDeadLetterStore(o);
  std::shared_ptr<Driver> driver = *NewRedisDriver(o);

  std::vector<std::string> keys;
  std::vector<int> master_of;
  for (int i = 0; i < 60; ++i) {
    keys.push_back(absl::StrCat("k-", i));
    absl::StatusOr<int> slot = c.KeySlot(keys.back());
    ASSERT_TRUE(slot.ok()) << slot.status();
    master_of.push_back(*c.MasterOfSlot(*slot));
  }
  const int victim = master_of[0];
  const std::string queue = NameOn(c, "q", victim);
  const std::string other_queue = NameOn(c, "q", victim, /*on=*/false);

  // Half the keys done while every replica keeps up; the other half only acquired.
  absl::flat_hash_set<std::string> done_ok;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<bool> got = idem->Acquire(keys[i], "a", absl::Seconds(30));
    ASSERT_TRUE(got.ok() && *got) << keys[i] << " " << got.status();
    if (i % 2 == 0) {
      ASSERT_TRUE(idem->MarkDone(keys[i], "a", absl::Hours(1)).ok()) << keys[i];
      done_ok.insert(keys[i]);
    }
  }
  ASSERT_TRUE(driver->SendToQueue(queue, "before", absl::ZeroDuration()).ok());

  absl::StatusOr<int> replica = StopReplicaOf(c, victim);
  ASSERT_TRUE(replica.ok()) << replica.status();
  // A send to the victim fails: only the master would have it. (The driver retries a send
  // within timeouts.request, so it may end with DeadlineExceeded; a store write fails at once.)
  const absl::Status send = driver->SendToQueue(queue, "lagging", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(send) || absl::IsDeadlineExceeded(send)) << send;
  int failed_marks = 0;
  for (size_t i = 1; i < keys.size(); i += 2) {
    const absl::Status st = idem->MarkDone(keys[i], "a", absl::Hours(1));
    if (master_of[i] == victim) {
      // Like the send: a failure, not an OK a failover would take back.
      EXPECT_TRUE(absl::IsUnavailable(st)) << keys[i] << " " << st;
      ++failed_marks;
    } else {
      EXPECT_TRUE(st.ok()) << keys[i] << " " << st;
    }
    if (st.ok()) done_ok.insert(keys[i]);
  }
  EXPECT_GT(failed_marks, 0);
  const std::string fresh = NameOn(c, "fresh-", victim);
  const absl::StatusOr<bool> acquired = idem->Acquire(fresh, "a", absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnavailable(acquired.status())) << acquired.status();
  const absl::StatusOr<std::string> stored = dlq->Store(Letter(queue, "d", "r"));
  EXPECT_TRUE(absl::IsUnavailable(stored.status())) << stored.status();
  EXPECT_TRUE(dlq->Store(Letter(other_queue, "d", "r")).ok());
  EXPECT_TRUE(driver->SendToQueue(other_queue, "fine", absl::ZeroDuration()).ok());

  ASSERT_TRUE(FailOverToStaleReplica(c, victim, *replica).ok());
  // Every done-mark reported OK survived: another owner cannot take its key.
  for (const std::string& key : done_ok) {
    absl::StatusOr<bool> again;
    ASSERT_TRUE(WaitUntil([&] {
      again = idem->Acquire(key, "b", absl::Seconds(30));
      return again.ok();
    })) << key
        << " " << again.status();
    EXPECT_FALSE(*again) << key << ": a done-mark reported OK was lost in the failover";
  }
  absl::StatusOr<int64_t> letters = dlq->Count(other_queue);
  ASSERT_TRUE(letters.ok()) << letters.status();
  EXPECT_EQ(*letters, 1);
}

// A Handler consumes 2,000 messages through the cluster (the driver at wait_replicas = 1, both
// stores at the documented settings: wait_replicas left unset, so they follow the Handler's
// driver; an effect counted per message); mid-stream the queue's master loses its
// replica (stopped, link dropped), takes writes only it has, is SIGKILLed and its stale replica
// promoted. Every message is handled or dead-lettered and no effect repeats, although mark-dones
// fail (Unavailable: the key's master had no replica to acknowledge them) and acks are lost: the
// process remembers such keys (docs/pipeline.md, "Guarantees"). On a failure it prints, per
// missing message, its events and every store call on its key.
// A batch slowed by the WAITs can hold a key past its delivery lease: the copy the broker then
// delivers goes back for later (the key is held here) rather than being settled as a duplicate,
// since the late batch may give its delivery back to a broker that no longer has it.
TEST(RedisClusterLaggingReplicaTest, AHandlerRepeatsNoEffectThroughTheFailover) {
  constexpr int kMessages = 2000;
  absl::StatusOr<std::unique_ptr<RedisCluster>> cluster = RedisCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RedisCluster& c = **cluster;
  RedisOptions o = ClusterOptions(c);
  o.timeouts.request = absl::Seconds(5);
  std::shared_ptr<Driver> producer_driver = *NewRedisDriver(o);
  std::shared_ptr<Driver> consumer_driver = *NewRedisDriver(o);
  // The stores at their defaults: one replication setting, the driver's, once the Handler joins
  // them (docs/redis-ha.md, "Replication").
  RedisOptions store_options = o;
  store_options.replication.wait_replicas = kWaitReplicasUnset;
  std::shared_ptr<DeadLetterStore> dead_letters = *NewRedisDeadLetterStore(store_options);
  auto idempotency =
      std::make_shared<TracingIdempotencyStore>(*NewRedisIdempotencyStore(store_options));
  EXPECT_EQ(idempotency->ReplicasAwaited(), 0);
  const std::string queue = "stream";
  absl::StatusOr<int> slot = c.KeySlot(queue);
  ASSERT_TRUE(slot.ok()) << slot.status();
  const int victim = *c.MasterOfSlot(*slot);

  std::vector<std::string> sent;
  {
    Publisher publisher = *Publisher::Create(producer_driver);
    for (int i = 0; i < kMessages; ++i) {
      absl::StatusOr<std::string> id =
          publisher.SendToQueue(queue, {.biz_uid = absl::StrCat("m-", i), .payload = "x"});
      ASSERT_TRUE(id.ok()) << id.status();
      sent.push_back(*id);
    }
  }

  absl::Mutex mu;
  absl::flat_hash_map<std::string, int> effects;  // message id: times handled
  HandlerOptions h;
  h.queue = queue;
  h.driver = consumer_driver;
  h.stores.dead_letters = dead_letters;
  h.stores.idempotency = idempotency;
  auto failures = std::make_shared<MarkDoneFailures>();
  h.observability.logger = failures;
  h.observability.observer_queue = 100000;
  h.observability.observer = [&](const Event& e) {
    failures->Write(
        {.message_id = e.message_id,
         .event = EventTypeName(e.type),
         .error = e.error,
         .text = absl::StrCat("event ", EventTypeName(e.type), " ", e.detail, " ", e.error)});
  };
  h.replay.interval = absl::ZeroDuration();
  h.flow.concurrency = 4;
  // Deliveries leased on the killed master come back when their lease runs out on the promoted
  // one. The idempotency lease (half of it, 4 s) must outlast a batch whose keys each wait
  // wait_timeout for a missing replica, or mark-done finds the lease gone (docs/scaling.md).
  h.flow.delivery_lease = absl::Seconds(8);
  h.infra_backoff = {.initial = absl::Milliseconds(20), .max = absl::Milliseconds(500)};
  h.handle = [&](const Message& m) {
    absl::MutexLock lock(&mu);
    ++effects[m.id];
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<Handler>> handler = Handler::Create(h);
  ASSERT_TRUE(handler.ok()) << handler.status();
  EXPECT_EQ(idempotency->ReplicasAwaited(), 1);
  EXPECT_EQ(dead_letters->ReplicasAwaited(), 1);
  ASSERT_TRUE((*handler)->Start().ok());
  auto handled = [&] {
    absl::MutexLock lock(&mu);
    return effects.size();
  };
  ASSERT_TRUE(WaitUntil([&] { return handled() >= kMessages / 4; }));

  absl::StatusOr<int> replica = StopReplicaOf(c, victim);
  ASSERT_TRUE(replica.ok()) << replica.status();
  // The master takes writes its replica never gets (the consumer's scripts run before their
  // WAIT fails): its replication offset moves on alone.
  const int64_t cut = ReplicationField(c, victim, "master_repl_offset");
  ASSERT_TRUE(
      WaitUntil([&] { return ReplicationField(c, victim, "master_repl_offset") > cut + 4096; }));
  const size_t at_failover = handled();
  ASSERT_TRUE(FailOverToStaleReplica(c, victim, *replica).ok());

  absl::flat_hash_set<std::string> dead;
  auto settled = [&] {
    absl::StatusOr<std::vector<DeadLetter>> letters = dead_letters->Fetch(queue, kMessages);
    if (!letters.ok()) return false;
    dead.clear();
    for (const DeadLetter& l : *letters) dead.insert(l.message_id);
    absl::MutexLock lock(&mu);
    for (const std::string& id : sent) {
      if (!effects.contains(id) && !dead.contains(id)) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitUntil(settled, absl::Seconds(40))) << [&] {
    absl::StatusOr<QueueCounts> q = consumer_driver->InspectQueue(queue);
    absl::MutexLock lock(&mu);
    std::string lines;
    for (size_t i = 0; i < sent.size(); ++i) {
      const std::string& id = sent[i];
      if (effects.contains(id) || dead.contains(id)) continue;
      absl::StrAppend(&lines, "missing ", id, ":\n");
      for (const std::string& l : failures->of(id)) absl::StrAppend(&lines, "  ", l, "\n");
      for (const std::string& l : idempotency->Of(absl::StrCat(queue, ".m-", i))) {
        absl::StrAppend(&lines, "  store: ", l, "\n");
      }
    }
    return absl::StrCat(lines, effects.size(), " handled, ", dead.size(), " dead-lettered; queue: ",
                        q.ok() ? absl::StrCat(q->ready, " ready ", q->delayed, " delayed ",
                                              q->in_flight, " in flight")
                               : q.status().ToString());
  }();
  // Then until the queue is drained, so a late redelivery would be counted.
  ASSERT_TRUE(WaitUntil([&] {
    absl::StatusOr<QueueCounts> q = consumer_driver->InspectQueue(queue);
    return q.ok() && q->ready + q->delayed + q->in_flight == 0;
  }));
  (*handler)->Stop();

  const absl::flat_hash_map<std::string, std::string> failed_marks = failures->ids();
  absl::MutexLock lock(&mu);
  int duplicates = 0;
  for (const auto& [id, times] : effects) {
    duplicates += times - 1;
    if (times > 1) {
      EXPECT_TRUE(failed_marks.contains(id)) << id << " handled " << times << " times";
    }
  }
  // Mark-dones fail as the store can fail them here: no replica to acknowledge (Unavailable),
  // or a batch slowed by those waits outlasting its key lease (FailedPrecondition).
  for (const auto& [id, error] : failed_marks) {
    EXPECT_TRUE(error.find("UNAVAILABLE") != std::string::npos ||
                error.find("FAILED_PRECONDITION") != std::string::npos)
        << id << ": " << error;
  }
  std::printf(
      "cluster lagging-replica failover: %d messages, %zu handled before the failover, %zu "
      "handled, %zu dead-lettered, %d duplicate effects, %zu failed mark-done\n",
      kMessages, at_failover, effects.size(), dead.size(), duplicates, failed_marks.size());
  ::testing::Test::RecordProperty("duplicates", duplicates);
  ::testing::Test::RecordProperty("failed_mark_done", static_cast<int>(failed_marks.size()));
  ::testing::Test::RecordProperty("dead_lettered", static_cast<int>(dead.size()));
  EXPECT_EQ(duplicates, 0);
  EXPECT_EQ(effects.size() + dead.size(), static_cast<size_t>(kMessages));
}

}  // namespace
}  // namespace bus::testing
