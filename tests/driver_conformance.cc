// The driver conformance suite (declared in driver_conformance.h; clause by clause,
// docs/driver-contract.md).
//
// Over 600 lines: one case per clause of the contract, run on every driver; splitting it would
// split the contract.

#include "tests/driver_conformance.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bus/internal/receive_loop.h"
#include "bus/names.h"
#include "gmock/gmock.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// Real-time bound for waiting on something that should happen; a broken driver fails the test
// at this point instead of hanging it.
constexpr absl::Duration kPatience = absl::Seconds(20);

// A queue or topic name unique in this process and across processes sharing one broker.
std::string Unique(absl::string_view base) {
  static std::atomic<int> counter{0};
  return absl::StrCat(base, "-", getpid(), "-", counter.fetch_add(1));
}

// Every byte value, so binary safety is checked everywhere.
std::string BinaryPayload(size_t size) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>(i * 7 % 256);
  return s;
}

std::vector<std::string> Datas(const std::vector<Delivery>& ds) {
  std::vector<std::string> out;
  for (const Delivery& d : ds) out.push_back(d.data);
  return out;
}

}  // namespace

void DriverConformanceTest::SetUp() {
  harness_ = GetParam().make();
  ASSERT_NE(harness_, nullptr);
  driver_ = harness_->NewDriver();
  ASSERT_NE(driver_, nullptr);
}

std::unique_ptr<Consumer> DriverConformanceTest::NewConsumer(const std::string& queue,
                                                             int max_in_flight,
                                                             absl::Duration lease) {
  if (lease == absl::ZeroDuration()) lease = harness_->ShortLease();
  auto c = driver_->NewConsumer(queue, ConsumerOptions{max_in_flight, lease});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<Delivery> DriverConformanceTest::Collect(Consumer* c, size_t n) {
  std::vector<Delivery> out;
  const absl::Time deadline = absl::Now() + kPatience;
  while (out.size() < n && absl::Now() < deadline) {
    const size_t before = out.size();
    absl::Status st = c->Receive(static_cast<int>(n - out.size()), harness_->PollWait(), {}, &out);
    EXPECT_TRUE(st.ok()) << st;
    if (out.size() == before && harness_->PollWait() == absl::ZeroDuration()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  EXPECT_EQ(out.size(), n) << "deliveries that arrived within " << kPatience;
  return out;
}

std::vector<Delivery> DriverConformanceTest::Poll(Consumer* c, int max) {
  std::vector<Delivery> out;
  absl::Status st = c->Receive(max, absl::ZeroDuration(), {}, &out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

void DriverConformanceTest::AckAll(Consumer* c, const std::vector<Delivery>& deliveries) {
  for (const Delivery& d : deliveries) EXPECT_TRUE(c->Ack(d.receipt).ok());
}

namespace {

TEST_P(DriverConformanceTest, CreateQueueIsIdempotent) {
  const std::string q = Unique("q");
  EXPECT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  EXPECT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "one", absl::ZeroDuration()).ok());
  EXPECT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  auto c = NewConsumer(q);
  auto got = Collect(c.get(), 1);
  EXPECT_THAT(Datas(got), ElementsAre("one"));  // re-creating did not drop the message
  AckAll(c.get(), got);
}

TEST_P(DriverConformanceTest, PingAnswers) {
  EXPECT_TRUE(driver_->Ping(absl::Seconds(5)).ok()) << driver_->Ping(absl::Seconds(5));
}

// Waits until InspectQueue(queue) reports exactly `want` (brokers may update their counts a
// moment after a call returns); fails with the last counts seen.
void ExpectCounts(Driver* driver, const std::string& queue, int64_t ready, int64_t delayed,
                  int64_t in_flight) {
  absl::StatusOr<QueueCounts> last;
  const bool reached = WaitUntil(
      [&] {
        last = driver->InspectQueue(queue);
        return last.ok() && last->queue == queue && last->ready == ready &&
               last->delayed == delayed && last->in_flight == in_flight;
      },
      kPatience);
  EXPECT_TRUE(reached) << "want ready " << ready << " delayed " << delayed << " in_flight "
                       << in_flight << ", got "
                       << (last.ok()
                               ? absl::StrCat(last->ready, " ", last->delayed, " ", last->in_flight)
                               : last.status().ToString());
}

TEST_P(DriverConformanceTest, InspectQueueCountsReadyDelayedAndInFlight) {
  const std::string q = Unique("insp");
  // Unknown queues are all zero, not an error; bad names are InvalidArgument.
  ExpectCounts(driver_.get(), q, 0, 0, 0);
  EXPECT_EQ(driver_->InspectQueue("bad name").status().code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  for (const char* d : {"a", "b", "c"}) {
    ASSERT_TRUE(driver_->SendToQueue(q, d, absl::ZeroDuration()).ok());
  }
  ASSERT_TRUE(driver_->SendToQueue(q, "later", absl::Hours(1)).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "soon", harness_->ShortLease()).ok());
  ExpectCounts(driver_.get(), q, 3, 2, 0);

  // A message whose delay has passed counts as ready.
  harness_->Advance(harness_->ShortLease() + absl::Milliseconds(100));
  ExpectCounts(driver_.get(), q, 4, 1, 0);

  // A leased message is in flight until settled; another client sees the same counts.
  auto c = NewConsumer(q, /*max_in_flight=*/1);
  std::vector<Delivery> got = Collect(c.get(), 1);
  ASSERT_EQ(got.size(), 1u);
  std::shared_ptr<Driver> other = harness_->NewDriver();
  ExpectCounts(other.get(), q, 3, 1, 1);
  // Acked: gone. (Closed first, because an NSQ consumer leases the next message as soon as it
  // has room; closing gives that one back.)
  AckAll(c.get(), got);
  c.reset();
  ExpectCounts(other.get(), q, 3, 1, 0);
}

TEST_P(DriverConformanceTest, ListQueuesHasCreatedSentToAndBoundQueues) {
  const std::string created = Unique("lq-created");
  const std::string sent = Unique("lq-sent");
  const std::string bound = Unique("lq-bound");
  const std::string topic = Unique("lq-topic");
  ASSERT_TRUE(driver_->CreateQueue(created, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(sent, "x", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->Subscribe(topic, bound, "").ok());
  ASSERT_TRUE(driver_->SendToTopic(topic, "t", "any").ok());

  absl::StatusOr<std::vector<std::string>> queues = driver_->ListQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  EXPECT_TRUE(std::is_sorted(queues->begin(), queues->end()));
  for (const std::string& q : {created, sent, bound}) {
    EXPECT_TRUE(std::find(queues->begin(), queues->end(), q) != queues->end()) << q;
  }
  // A topic message counts in the bound queue.
  ExpectCounts(driver_.get(), bound, 1, 0, 0);
}

TEST_P(DriverConformanceTest, BadNamesAreInvalidArgumentUpFront) {
  const std::vector<std::string> bad = {
      "",           "has space",    std::string(65, 'a'),   "slash/name",
      "colon:name", "h\xc3\xa9llo", std::string("nul\0", 4)};
  for (const std::string& name : bad) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->CreateQueue(name, absl::ZeroDuration())));
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->SendToQueue(name, "x", absl::ZeroDuration())));
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->SendToTopic(name, "x", "k")));
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->Subscribe(name, Unique("q"), "")));
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->Subscribe(Unique("t"), name, "")));
    EXPECT_TRUE(absl::IsInvalidArgument(
        driver_->NewConsumer(name, ConsumerOptions{1, harness_->ShortLease()}).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->Unsubscribe(name, Unique("q"), "")));
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->Unsubscribe(Unique("t"), name, "")));
    EXPECT_TRUE(absl::IsInvalidArgument(driver_->DeleteQueue(name)));
  }
  // A bad binding key too (a NUL byte).
  EXPECT_TRUE(absl::IsInvalidArgument(
      driver_->Unsubscribe(Unique("t"), Unique("q"), std::string("a\0", 2))));
  // The edges of the rule are accepted.
  std::string longest = Unique("e");
  longest.resize(kMaxNameLength, 'x');
  EXPECT_TRUE(driver_->CreateQueue(longest, absl::ZeroDuration()).ok());
  EXPECT_TRUE(driver_->CreateQueue(Unique("Az09._-"), absl::ZeroDuration()).ok());
}

TEST_P(DriverConformanceTest, BadOptionsAreInvalidArgument) {
  const std::string q = Unique("q");
  EXPECT_TRUE(absl::IsInvalidArgument(
      driver_->NewConsumer(q, ConsumerOptions{-1, harness_->ShortLease()}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      driver_->NewConsumer(q, ConsumerOptions{1, absl::ZeroDuration()}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(driver_->SendToQueue(q, "x", absl::Seconds(-1))));
  EXPECT_TRUE(absl::IsInvalidArgument(driver_->CreateQueue(q, absl::Seconds(-1))));
}

TEST_P(DriverConformanceTest, SendThenReceiveIsBinarySafeAndAckedMessagesAreGone) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  const std::string big = BinaryPayload(100 * 1024);
  ASSERT_TRUE(driver_->SendToQueue(q, "a", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, big, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, std::string("\0\xff\0", 3), absl::ZeroDuration()).ok());
  auto c = NewConsumer(q);
  auto got = Collect(c.get(), 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_THAT(Datas(got), UnorderedElementsAre("a", big, std::string("\0\xff\0", 3)));
  for (const Delivery& d : got) {
    EXPECT_FALSE(d.receipt.empty());
    EXPECT_LE(d.attempts, 1);  // first delivery (0: the broker does not count)
  }
  AckAll(c.get(), got);
  harness_->Advance(harness_->ShortLease() * 2);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
}

TEST_P(DriverConformanceTest, SendingToAQueueNeverCreatedCreatesIt) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "hello", absl::ZeroDuration()).ok());
  auto c = NewConsumer(q);
  auto got = Collect(c.get(), 1);
  EXPECT_THAT(Datas(got), ElementsAre("hello"));
  AckAll(c.get(), got);
}

// A queue's backlog waits for the queue's own consumers: messages sent before any consumer (or
// CreateQueue) existed, to a queue and through a topic binding, all reach the first consumer,
// and a consumer of another queue bound to the same topic takes none of the queue's own.
TEST_P(DriverConformanceTest, ABacklogSentBeforeAnyConsumerReachesTheQueuesFirstConsumer) {
  const std::string q = Unique("q");
  const std::string other = Unique("other");
  const std::string topic = Unique("t");
  ASSERT_TRUE(driver_->Subscribe(topic, q, "#").ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(driver_->SendToQueue(q, absl::StrCat("direct", i), absl::ZeroDuration()).ok());
  }
  ASSERT_TRUE(driver_->SendToTopic(topic, "fanned", "a.b").ok());
  ASSERT_TRUE(driver_->Subscribe(topic, other, "#").ok());
  auto foreign = NewConsumer(other);
  EXPECT_THAT(Poll(foreign.get()), IsEmpty());  // bound after the publish: nothing for it
  auto c = NewConsumer(q);
  auto got = Collect(c.get(), 6);
  EXPECT_THAT(Datas(got), UnorderedElementsAre("direct0", "direct1", "direct2", "direct3",
                                               "direct4", "fanned"));
  AckAll(c.get(), got);
}

// PeekReady shows the message the queue delivers next and takes nothing; NSQ cannot show a
// message without taking it and says so (Unimplemented, docs/driver-contract.md).
TEST_P(DriverConformanceTest, PeekReadyShowsTheNextMessageWithoutTakingIt) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  absl::StatusOr<std::optional<std::string>> peek = driver_->PeekReady(q);
  if (driver_->name() == "nsq") {
    EXPECT_TRUE(absl::IsUnimplemented(peek.status())) << peek.status();
    return;
  }
  ASSERT_TRUE(peek.ok()) << peek.status();
  EXPECT_FALSE(peek->has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(driver_->PeekReady("bad name!").status()));
  ASSERT_TRUE(driver_->SendToQueue(q, "first", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "second", absl::ZeroDuration()).ok());
  EXPECT_EQ(driver_->PeekReady(q).value_or(std::nullopt), "first");
  EXPECT_EQ(driver_->PeekReady(q).value_or(std::nullopt), "first");  // still there
  auto c = NewConsumer(q);
  auto got = Collect(c.get(), 1);
  EXPECT_THAT(Datas(got), ElementsAre("first"));
  EXPECT_EQ(driver_->PeekReady(q).value_or(std::nullopt), "second");
  AckAll(c.get(), got);
  got = Collect(c.get(), 1);
  EXPECT_THAT(Datas(got), ElementsAre("second"));
  AckAll(c.get(), got);
  EXPECT_EQ(driver_->PeekReady(q).value_or(std::nullopt), std::nullopt);
}

TEST_P(DriverConformanceTest, SendBatchDeliversEveryMessage) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  std::vector<std::string> batch;
  for (int i = 0; i < 100; ++i) batch.push_back(absl::StrCat("m", i));
  ASSERT_TRUE(driver_->SendBatchToQueue(q, batch, absl::ZeroDuration()).ok());
  auto c = NewConsumer(q, /*max_in_flight=*/100);
  auto got = Collect(c.get(), 100);
  std::vector<std::string> datas = Datas(got);
  std::sort(datas.begin(), datas.end());
  std::sort(batch.begin(), batch.end());
  EXPECT_EQ(datas, batch);
  AckAll(c.get(), got);
}

TEST_P(DriverConformanceTest, PerMessageDelayIsHonoured) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  const absl::Duration delay = harness_->ShortLease() * 2;
  ASSERT_TRUE(driver_->SendToQueue(q, "later", delay).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "now", absl::ZeroDuration()).ok());
  auto c = NewConsumer(q);
  auto first = Collect(c.get(), 1);
  EXPECT_THAT(Datas(first), ElementsAre("now"));
  AckAll(c.get(), first);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
  harness_->Advance(delay + harness_->ShortLease() / 2);
  auto second = Collect(c.get(), 1);
  EXPECT_THAT(Datas(second), ElementsAre("later"));
  AckAll(c.get(), second);
}

TEST_P(DriverConformanceTest, PerQueueDelayAppliesToEveryMessageAndAddsToMessageDelay) {
  const std::string q = Unique("q");
  const absl::Duration d = harness_->ShortLease() * 2;
  ASSERT_TRUE(driver_->CreateQueue(q, d).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "queue-delay", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "both-delays", d).ok());
  auto c = NewConsumer(q);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
  harness_->Advance(d + d / 4);
  auto first = Collect(c.get(), 1);
  EXPECT_THAT(Datas(first), ElementsAre("queue-delay"));
  AckAll(c.get(), first);
  EXPECT_THAT(Poll(c.get()), IsEmpty());  // the other waits for both delays
  harness_->Advance(d);
  auto second = Collect(c.get(), 1);
  EXPECT_THAT(Datas(second), ElementsAre("both-delays"));
  AckAll(c.get(), second);
}

TEST_P(DriverConformanceTest, TopicFansOutToEveryMatchingBinding) {
  const std::string t = Unique("t");
  const std::string star = Unique("star"), hash = Unique("hash"), other = Unique("other"),
                    all = Unique("all"), exact = Unique("exact");
  ASSERT_TRUE(driver_->CreateQueue(star, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->CreateQueue(hash, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->CreateQueue(other, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->CreateQueue(all, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->CreateQueue(exact, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->Subscribe(t, star, "order.*").ok());
  ASSERT_TRUE(driver_->Subscribe(t, hash, "order.#").ok());
  ASSERT_TRUE(driver_->Subscribe(t, other, "payment.*").ok());
  ASSERT_TRUE(driver_->Subscribe(t, all, "").ok());
  ASSERT_TRUE(driver_->Subscribe(t, exact, "order.created.eu").ok());
  // Consumers exist before publishing (a broker may only route to live subscriptions).
  auto c_star = NewConsumer(star), c_hash = NewConsumer(hash), c_other = NewConsumer(other),
       c_all = NewConsumer(all), c_exact = NewConsumer(exact);
  ASSERT_TRUE(driver_->SendToTopic(t, "created", "order.created").ok());
  ASSERT_TRUE(driver_->SendToTopic(t, "eu", "order.created.eu").ok());

  auto got_star = Collect(c_star.get(), 1);
  auto got_hash = Collect(c_hash.get(), 2);
  auto got_all = Collect(c_all.get(), 2);
  auto got_exact = Collect(c_exact.get(), 1);
  EXPECT_THAT(Datas(got_star), ElementsAre("created"));
  EXPECT_THAT(Datas(got_hash), UnorderedElementsAre("created", "eu"));
  EXPECT_THAT(Datas(got_all), UnorderedElementsAre("created", "eu"));
  EXPECT_THAT(Datas(got_exact), ElementsAre("eu"));
  // Nothing else arrives: the non-matching queue stays empty, and no queue gets extra copies.
  harness_->Advance(harness_->ShortLease() / 2);
  EXPECT_THAT(Poll(c_other.get()), IsEmpty());
  EXPECT_THAT(Poll(c_star.get()), IsEmpty());
  EXPECT_THAT(Poll(c_exact.get()), IsEmpty());
  AckAll(c_star.get(), got_star);
  AckAll(c_hash.get(), got_hash);
  AckAll(c_all.get(), got_all);
  AckAll(c_exact.get(), got_exact);
}

TEST_P(DriverConformanceTest, SubscribeIsIdempotent) {
  const std::string t = Unique("t");
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->Subscribe(t, q, "a.*").ok());
  ASSERT_TRUE(driver_->Subscribe(t, q, "a.*").ok());
  auto c = NewConsumer(q);
  ASSERT_TRUE(driver_->SendToTopic(t, "once", "a.b").ok());
  auto got = Collect(c.get(), 1);
  EXPECT_THAT(Datas(got), ElementsAre("once"));
  harness_->Advance(harness_->ShortLease() / 2);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
  AckAll(c.get(), got);
}

TEST_P(DriverConformanceTest, UnsubscribeStopsTopicCopiesAndIsIdempotent) {
  const std::string t = Unique("t");
  const std::string q = Unique("q"), keep = Unique("keep");
  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->CreateQueue(keep, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->Subscribe(t, q, "a.*").ok());
  ASSERT_TRUE(driver_->Subscribe(t, q, "b.#").ok());
  ASSERT_TRUE(driver_->Subscribe(t, keep, "").ok());
  auto cq = NewConsumer(q), ck = NewConsumer(keep);

  // One of two keys removed (twice: idempotent): the other key still routes to the queue.
  ASSERT_TRUE(driver_->Unsubscribe(t, q, "a.*").ok());
  ASSERT_TRUE(driver_->Unsubscribe(t, q, "a.*").ok());
  ASSERT_TRUE(driver_->SendToTopic(t, "a1", "a.x").ok());
  ASSERT_TRUE(driver_->SendToTopic(t, "b1", "b.x").ok());
  auto got_keep = Collect(ck.get(), 2);
  auto got_q = Collect(cq.get(), 1);
  EXPECT_THAT(Datas(got_keep), UnorderedElementsAre("a1", "b1"));
  EXPECT_THAT(Datas(got_q), ElementsAre("b1"));
  AckAll(ck.get(), got_keep);
  AckAll(cq.get(), got_q);

  // The last key removed: no topic copy reaches the queue; a message sent to it directly does,
  // and the other queue's binding is untouched. A binding never made is OK to remove.
  ASSERT_TRUE(driver_->Unsubscribe(t, q, "b.#").ok());
  ASSERT_TRUE(driver_->Unsubscribe(t, q, "b.#").ok());
  ASSERT_TRUE(driver_->Unsubscribe(Unique("t"), q, "never").ok());
  ASSERT_TRUE(driver_->SendToTopic(t, "b2", "b.y").ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "direct", absl::ZeroDuration()).ok());
  got_keep = Collect(ck.get(), 1);
  got_q = Collect(cq.get(), 1);
  EXPECT_THAT(Datas(got_keep), ElementsAre("b2"));
  EXPECT_THAT(Datas(got_q), ElementsAre("direct"));
  AckAll(ck.get(), got_keep);
  AckAll(cq.get(), got_q);
  harness_->Advance(harness_->ShortLease() / 2);
  EXPECT_THAT(Poll(cq.get()), IsEmpty());

  // Subscribing again routes again.
  ASSERT_TRUE(driver_->Subscribe(t, q, "c").ok());
  ASSERT_TRUE(driver_->SendToTopic(t, "c1", "c").ok());
  got_q = Collect(cq.get(), 1);
  EXPECT_THAT(Datas(got_q), ElementsAre("c1"));
  AckAll(cq.get(), got_q);
  got_keep = Collect(ck.get(), 1);
  AckAll(ck.get(), got_keep);
}

TEST_P(DriverConformanceTest, DeleteQueueRemovesItsMessagesAndDelayAndIsIdempotent) {
  const std::string q = Unique("del");
  ASSERT_TRUE(driver_->CreateQueue(q, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "ready", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "later", absl::Hours(1)).ok());
  ExpectCounts(driver_.get(), q, 1, 1, 0);
  ASSERT_TRUE(driver_->CreateQueue(q, absl::Hours(1)).ok());

  ASSERT_TRUE(driver_->DeleteQueue(q).ok());
  ASSERT_TRUE(driver_->DeleteQueue(q).ok());
  ASSERT_TRUE(driver_->DeleteQueue(Unique("never")).ok());
  absl::StatusOr<std::vector<std::string>> queues = driver_->ListQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  EXPECT_THAT(*queues, ::testing::Not(::testing::Contains(q)));
  ExpectCounts(driver_.get(), q, 0, 0, 0);

  // Sent to again, the queue starts afresh: no old message, no per-queue delay.
  ASSERT_TRUE(driver_->SendToQueue(q, "fresh", absl::ZeroDuration()).ok());
  auto c = NewConsumer(q);
  auto got = Collect(c.get(), 1);
  EXPECT_THAT(Datas(got), ElementsAre("fresh"));
  AckAll(c.get(), got);
  harness_->Advance(harness_->ShortLease() / 2);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
}

TEST_P(DriverConformanceTest, UnsubscribeThenDeleteQueueLeavesNothingBehind) {
  const std::string t = Unique("t");
  const std::string q = Unique("tmp");
  ASSERT_TRUE(driver_->Subscribe(t, q, "k.#").ok());
  ASSERT_TRUE(driver_->SendToTopic(t, "x", "k.1").ok());
  ExpectCounts(driver_.get(), q, 1, 0, 0);

  ASSERT_TRUE(driver_->Unsubscribe(t, q, "k.#").ok());
  ASSERT_TRUE(driver_->DeleteQueue(q).ok());
  ASSERT_TRUE(driver_->SendToTopic(t, "y", "k.2").ok());
  harness_->Advance(harness_->ShortLease() / 2);
  absl::StatusOr<std::vector<std::string>> queues = driver_->ListQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  EXPECT_THAT(*queues, ::testing::Not(::testing::Contains(q)));
  // Another client (another process) sees the same.
  std::shared_ptr<Driver> other = harness_->NewDriver();
  absl::StatusOr<std::vector<std::string>> seen = other->ListQueues();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_THAT(*seen, ::testing::Not(::testing::Contains(q)));
  absl::StatusOr<QueueCounts> counts = other->InspectQueue(q);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->ready + counts->delayed + counts->in_flight, 0);
}

TEST_P(DriverConformanceTest, NackRedeliversAndCountsAttempts) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "again", absl::ZeroDuration()).ok());
  auto c = NewConsumer(q);
  auto first = Collect(c.get(), 1);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_TRUE(c->Nack(first[0].receipt, absl::ZeroDuration()).ok());
  auto second = Collect(c.get(), 1);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].data, "again");
  if (first[0].attempts > 0) {
    EXPECT_EQ(second[0].attempts, first[0].attempts + 1);
  }
  // The first receipt is settled: it cannot be settled again.
  EXPECT_TRUE(absl::IsFailedPrecondition(c->Ack(first[0].receipt)));
  AckAll(c.get(), second);
}

TEST_P(DriverConformanceTest, NackWithDelayWaitsBeforeRedelivery) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "later", absl::ZeroDuration()).ok());
  auto c = NewConsumer(q);
  auto first = Collect(c.get(), 1);
  ASSERT_EQ(first.size(), 1u);
  const absl::Duration delay = harness_->ShortLease() * 2;
  ASSERT_TRUE(c->Nack(first[0].receipt, delay).ok());
  EXPECT_THAT(Poll(c.get()), IsEmpty());
  harness_->Advance(delay + harness_->ShortLease() / 2);
  auto second = Collect(c.get(), 1);
  EXPECT_THAT(Datas(second), ElementsAre("later"));
  AckAll(c.get(), second);
}

TEST_P(DriverConformanceTest, ExpiredLeaseIsRedeliveredAndTheStaleAckIsRefused) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "leased", absl::ZeroDuration()).ok());
  auto a = NewConsumer(q);
  auto b = NewConsumer(q);
  auto held = Collect(a.get(), 1);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_THAT(Poll(b.get()), IsEmpty());  // never the same delivery at once
  harness_->Advance(harness_->ShortLease() * 2);
  auto again = Collect(b.get(), 1);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].data, "leased");
  EXPECT_TRUE(absl::IsFailedPrecondition(a->Ack(held[0].receipt)));
  EXPECT_TRUE(absl::IsFailedPrecondition(a->Extend(held[0].receipt)));
  EXPECT_TRUE(b->Ack(again[0].receipt).ok());
  harness_->Advance(harness_->ShortLease() * 2);
  EXPECT_THAT(Poll(a.get()), IsEmpty());
  EXPECT_THAT(Poll(b.get()), IsEmpty());
}

TEST_P(DriverConformanceTest, AckManyAcksEachAndRefusesOnlyALostLease) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "stale", absl::ZeroDuration()).ok());
  auto a = NewConsumer(q, 8);
  auto b = NewConsumer(q, 8);
  auto lost = Collect(a.get(), 1);
  ASSERT_EQ(lost.size(), 1u);
  harness_->Advance(harness_->ShortLease() * 2);
  auto retaken = Collect(b.get(), 1);  // the stale delivery's lease is now b's
  ASSERT_EQ(retaken.size(), 1u);
  EXPECT_TRUE(b->Ack(retaken[0].receipt).ok());
  b.reset();  // a alone receives what follows (a push broker would share it with b)
  ASSERT_TRUE(driver_->SendBatchToQueue(q, {"m1", "m2"}, absl::ZeroDuration()).ok());
  auto fresh = Collect(a.get(), 2);
  ASSERT_EQ(fresh.size(), 2u);
  const std::vector<absl::string_view> batch = {fresh[0].receipt, lost[0].receipt,
                                                fresh[1].receipt};
  std::vector<absl::Status> results(batch.size());
  a->AckMany(batch, absl::MakeSpan(results));
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(absl::IsFailedPrecondition(results[1])) << results[1];
  EXPECT_TRUE(results[2].ok()) << results[2];
  // The acked ones are gone.
  harness_->Advance(harness_->ShortLease() * 2);
  EXPECT_THAT(Poll(a.get()), IsEmpty());
}

TEST_P(DriverConformanceTest, ExtendKeepsTheLease) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "long", absl::ZeroDuration()).ok());
  const absl::Duration lease = harness_->ShortLease() * 2;
  auto a = NewConsumer(q, 16, lease);
  auto b = NewConsumer(q, 16, lease);
  auto held = Collect(a.get(), 1);
  ASSERT_EQ(held.size(), 1u);
  for (int i = 0; i < 3; ++i) {
    harness_->Advance(lease * 6 / 10);
    ASSERT_TRUE(a->Extend(held[0].receipt).ok()) << "round " << i;
  }
  EXPECT_THAT(Poll(b.get()), IsEmpty());  // 1.8 leases have passed, but it was extended
  EXPECT_TRUE(a->Ack(held[0].receipt).ok());
}

TEST_P(DriverConformanceTest, CompetingConsumersShareTheQueueWithoutOverlap) {
  const std::string q = Unique("q");
  constexpr int kMessages = 200;
  std::vector<std::string> batch;
  for (int i = 0; i < kMessages; ++i) batch.push_back(absl::StrCat(i));
  ASSERT_TRUE(driver_->SendBatchToQueue(q, batch, absl::ZeroDuration()).ok());
  auto other_driver = harness_->NewDriver();
  auto c1 = NewConsumer(q, 8);
  auto c2_or = other_driver->NewConsumer(q, ConsumerOptions{8, harness_->ShortLease() * 10});
  ASSERT_TRUE(c2_or.ok());
  auto c2 = std::move(*c2_or);
  absl::Mutex mu;
  std::multiset<std::string> seen;
  auto run = [&](Consumer* c) {
    const absl::Time deadline = absl::Now() + kPatience;
    while (absl::Now() < deadline) {
      {
        absl::MutexLock lock(&mu);
        if (seen.size() >= static_cast<size_t>(kMessages)) return;
      }
      std::vector<Delivery> got;
      ASSERT_TRUE(c->Receive(4, harness_->PollWait(), {}, &got).ok());
      if (got.empty() && harness_->PollWait() == absl::ZeroDuration()) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      for (const Delivery& d : got) {
        {
          absl::MutexLock lock(&mu);
          seen.insert(d.data);
        }
        ASSERT_TRUE(c->Ack(d.receipt).ok());
      }
    }
  };
  std::thread t1(run, c1.get());
  std::thread t2(run, c2.get());
  t1.join();
  t2.join();
  EXPECT_EQ(seen.size(), static_cast<size_t>(kMessages));
  for (const std::string& m : batch) EXPECT_EQ(seen.count(m), 1u) << m;
}

TEST_P(DriverConformanceTest, AConsumerNeverHoldsMoreThanMaxInFlight) {
  const std::string q = Unique("q");
  std::vector<std::string> batch;
  for (int i = 0; i < 5; ++i) batch.push_back(absl::StrCat(i));
  ASSERT_TRUE(driver_->SendBatchToQueue(q, batch, absl::ZeroDuration()).ok());
  auto c = NewConsumer(q, /*max_in_flight=*/2, harness_->ShortLease() * 10);
  auto first = Collect(c.get(), 2);
  ASSERT_EQ(first.size(), 2u);
  harness_->Advance(harness_->ShortLease() / 2);
  EXPECT_THAT(Poll(c.get(), 10), IsEmpty());
  ASSERT_TRUE(c->Ack(first[0].receipt).ok());
  auto next = Collect(c.get(), 1);
  EXPECT_EQ(next.size(), 1u);
  harness_->Advance(harness_->ShortLease() / 2);
  EXPECT_THAT(Poll(c.get(), 10), IsEmpty());
  ASSERT_TRUE(c->Ack(first[1].receipt).ok());
  AckAll(c.get(), next);
  auto rest = Collect(c.get(), 2);
  EXPECT_EQ(rest.size(), 2u);
  AckAll(c.get(), rest);
}

TEST_P(DriverConformanceTest, AClosedConsumersDeliveriesAreRedelivered) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "x", absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_->SendToQueue(q, "y", absl::ZeroDuration()).ok());
  {
    auto a = NewConsumer(q);
    auto held = Collect(a.get(), 2);
    ASSERT_EQ(held.size(), 2u);
  }  // closed without settling
  harness_->Advance(harness_->ShortLease() * 2);
  auto b = NewConsumer(q);
  auto got = Collect(b.get(), 2);
  EXPECT_THAT(Datas(got), UnorderedElementsAre("x", "y"));
  AckAll(b.get(), got);
}

TEST_P(DriverConformanceTest, ReceiveOnAnEmptyQueueReturnsNothingAndStopInterruptsIt) {
  const std::string q = Unique("q");
  auto c = NewConsumer(q);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
  std::stop_source stop;
  auto waiting = std::async(std::launch::async, [&] {
    std::vector<Delivery> out;
    absl::Status st = c->Receive(1, absl::Hours(1), stop.get_token(), &out);
    return std::make_pair(st, out.size());
  });
  // Stop lands once Receive is blocked, not before it began.
  ASSERT_TRUE(WaitUntil([&] { return harness_->ReceiveBlocked(); }));
  stop.request_stop();
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  auto [st, n] = waiting.get();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(n, 0u);
}

// ReceiveMessage, the run loop every driver shares (bus/receive_loop.h).

class ReceiveLoop {
 public:
  ReceiveLoop(Driver* driver, std::string queue, ReceiveOptions options, ReceiveFn fn)
      : result_(std::async(std::launch::async, [=, this] {
          return ReceiveMessage(*driver, queue, options, fn, stop_.get_token());
        })) {}
  ~ReceiveLoop() {
    stop_.request_stop();
    if (result_.valid()) result_.wait();
  }
  std::future<absl::Status>& Stop() {
    stop_.request_stop();
    return result_;
  }

 private:
  std::stop_source stop_;
  std::future<absl::Status> result_;
};

TEST_P(DriverConformanceTest, ReceiveBatchesSaysOnceWhenItConsumes) {
  const std::string q = Unique("q");
  std::atomic<int> consuming{0};
  ReceiveOptions options;
  options.lease = harness_->ShortLease() * 10;
  options.poll_wait = harness_->ShortLease();
  options.on_consuming = [&] { consuming.fetch_add(1); };
  ASSERT_TRUE(driver_->SendToQueue(q, "x", absl::ZeroDuration()).ok());
  std::atomic<int> seen{0};
  {
    ReceiveLoop loop(driver_.get(), q, options, [&](const Delivery&) {
      seen.fetch_add(1);
      return Settlement::Done();
    });
    ASSERT_TRUE(WaitUntil([&] { return seen.load() == 1; }));
    EXPECT_EQ(consuming.load(), 1);
    auto& result = loop.Stop();
    ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    EXPECT_TRUE(result.get().ok());
  }
  EXPECT_EQ(consuming.load(), 1);
}

TEST_P(DriverConformanceTest, ReceiveMessageHandsEachMessageToTheCallbackUntilStopped) {
  const std::string q = Unique("q");
  absl::Mutex mu;
  std::vector<std::string> seen;
  ReceiveOptions options;
  options.concurrency = 3;
  options.max_in_flight = 6;
  options.lease = harness_->ShortLease() * 10;
  options.poll_wait = harness_->ShortLease();
  std::vector<std::string> batch;
  for (int i = 0; i < 50; ++i) batch.push_back(absl::StrCat(i));
  ASSERT_TRUE(driver_->SendBatchToQueue(q, batch, absl::ZeroDuration()).ok());
  {
    ReceiveLoop loop(driver_.get(), q, options, [&](const Delivery& d) {
      absl::MutexLock lock(&mu);
      seen.push_back(d.data);
      return Settlement::Done();
    });
    ASSERT_TRUE(WaitUntil([&] {
      absl::MutexLock lock(&mu);
      return seen.size() >= batch.size();
    }));
    auto& result = loop.Stop();
    ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    EXPECT_TRUE(result.get().ok());
  }
  std::sort(seen.begin(), seen.end());
  std::sort(batch.begin(), batch.end());
  EXPECT_EQ(seen, batch);
  // Everything was acked: nothing comes back.
  harness_->Advance(options.lease + harness_->ShortLease());
  auto c = NewConsumer(q);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
}

TEST_P(DriverConformanceTest, ReceiveBatchesHandsOutBoundedBatchesAndSettlesEachEntry) {
  const std::string q = Unique("q");
  std::vector<std::string> sent;
  for (int i = 0; i < 60; ++i) sent.push_back(absl::StrCat(i));
  ASSERT_TRUE(driver_->SendBatchToQueue(q, sent, absl::ZeroDuration()).ok());
  ReceiveOptions options;
  options.concurrency = 2;
  options.max_in_flight = 16;
  options.batch_size = 5;
  options.lease = harness_->ShortLease() * 10;
  options.poll_wait = harness_->ShortLease();
  absl::Mutex mu;
  std::vector<std::string> done;
  size_t largest = 0;
  int redelivered = 0;  // "7" is given back once, then comes again
  std::stop_source stop;
  auto result = std::async(std::launch::async, [&] {
    return ReceiveBatches(
        *driver_, q, options,
        [&](absl::Span<const Delivery> ds, absl::Span<Settlement> out) {
          absl::MutexLock lock(&mu);
          largest = std::max(largest, ds.size());
          EXPECT_EQ(ds.size(), out.size());
          for (size_t i = 0; i < ds.size(); ++i) {
            EXPECT_FALSE(out[i].done);  // every entry starts as Redeliver()
            if (ds[i].data == "7" && redelivered++ == 0) continue;
            done.push_back(ds[i].data);
            out[i] = Settlement::Done();
          }
        },
        stop.get_token());
  });
  EXPECT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return done.size() >= sent.size();
  }));
  stop.request_stop();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(result.get().ok());
  absl::MutexLock lock(&mu);
  EXPECT_GE(largest, 1u);
  EXPECT_LE(largest, 5u);
  EXPECT_EQ(redelivered, 2);
  std::sort(done.begin(), done.end());
  std::sort(sent.begin(), sent.end());
  EXPECT_EQ(done, sent);
  // Every entry was acked: nothing comes back.
  harness_->Advance(options.lease + harness_->ShortLease());
  auto c = NewConsumer(q);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
}

TEST_P(DriverConformanceTest, ReceiveMessageRedeliversWhatTheCallbackDidNotFinish) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "flaky", absl::ZeroDuration()).ok());
  std::atomic<int> calls{0};
  ReceiveOptions options;
  options.poll_wait = harness_->ShortLease();
  options.lease = harness_->ShortLease() * 10;
  ReceiveLoop loop(driver_.get(), q, options, [&](const Delivery&) {
    return calls.fetch_add(1) == 0 ? Settlement::Redeliver() : Settlement::Done();
  });
  EXPECT_TRUE(WaitUntil([&] { return calls.load() >= 2; }));
  auto& result = loop.Stop();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(result.get().ok());
  EXPECT_EQ(calls.load(), 2);
}

TEST_P(DriverConformanceTest, ReceiveMessageSurvivesACallbackThatThrows) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "boom", absl::ZeroDuration()).ok());
  std::atomic<int> calls{0};
  ReceiveOptions options;
  options.poll_wait = harness_->ShortLease();
  options.lease = harness_->ShortLease() * 10;
  ReceiveLoop loop(driver_.get(), q, options, [&](const Delivery&) -> Settlement {
    if (calls.fetch_add(1) == 0) throw std::runtime_error("boom");
    return Settlement::Done();
  });
  EXPECT_TRUE(WaitUntil([&] { return calls.load() >= 2; }));
  auto& result = loop.Stop();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(result.get().ok());
}

}  // namespace

// Stop while one callback runs: it finishes and is acked; the three other deliveries (in the
// prefetch buffer, or with batch_size > 1 in the running worker's batch) come back.
void DriverConformanceTest::CheckStopFinishesInFlightWork(int batch_size) {
  const std::string q = Unique("q");
  std::vector<std::string> batch = {"first", "second", "third", "fourth"};
  ASSERT_TRUE(driver_->SendBatchToQueue(q, batch, absl::ZeroDuration()).ok());
  absl::Mutex mu;
  bool release = false;
  std::vector<std::string> started;
  ReceiveOptions options;
  options.concurrency = 1;
  options.max_in_flight = 4;
  options.batch_size = batch_size;
  options.poll_wait = harness_->ShortLease();
  options.lease = harness_->ShortLease() * 20;
  options.shutdown_timeout = absl::Hours(1);
  auto loop = std::make_unique<ReceiveLoop>(driver_.get(), q, options, [&](const Delivery& d) {
    absl::MutexLock lock(&mu);
    started.push_back(d.data);
    mu.Await(absl::Condition(&release));
    return Settlement::Done();
  });
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return !started.empty();
  }));
  auto& result = loop->Stop();
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(result.get().ok());
  loop.reset();
  std::string finished;
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(started.size(), 1u);  // nothing new started after stop
    finished = started[0];
  }
  // The finished message was acked; the three others come back (promptly, or after a lease).
  harness_->Advance(options.lease + harness_->ShortLease());
  auto c = NewConsumer(q);
  auto rest = Collect(c.get(), 3);
  std::vector<std::string> got = Datas(rest);
  std::vector<std::string> expected;
  for (const auto& m : batch) {
    if (m != finished) expected.push_back(m);
  }
  std::sort(got.begin(), got.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(got, expected);
  AckAll(c.get(), rest);
  harness_->Advance(harness_->ShortLease() / 2);
  EXPECT_THAT(Poll(c.get()), IsEmpty());
}

namespace {

TEST_P(DriverConformanceTest, StopFinishesInFlightWorkSettlesItAndGivesTheRestBack) {
  CheckStopFinishesInFlightWork(1);
}

TEST_P(DriverConformanceTest, StopGivesBackTheUnstartedRestOfABatch) {
  CheckStopFinishesInFlightWork(4);
}

TEST_P(DriverConformanceTest, StopAbandonsACallbackThatOutlivesTheShutdownTimeout) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "stuck", absl::ZeroDuration()).ok());
  auto release = std::make_shared<absl::Notification>();
  auto started = std::make_shared<std::atomic<bool>>(false);
  ReceiveOptions options;
  options.poll_wait = harness_->ShortLease();
  options.lease = harness_->ShortLease() * 2;
  options.shutdown_timeout = harness_->ShortLease() / 2;
  auto loop =
      std::make_unique<ReceiveLoop>(driver_.get(), q, options, [release, started](const Delivery&) {
        started->store(true);
        release->WaitForNotification();
        return Settlement::Done();
      });
  ASSERT_TRUE(WaitUntil([&] { return started->load(); }));
  auto& result = loop->Stop();
  // Let the shutdown timeout pass on the driver's clock.
  while (result.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    harness_->Advance(options.shutdown_timeout);
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.get()));
  loop.reset();
  // The abandoned delivery is left unsettled, so it is delivered again once its lease runs out.
  harness_->Advance(options.lease * 2);
  auto c = NewConsumer(q);
  auto again = Collect(c.get(), 1);
  EXPECT_THAT(Datas(again), ElementsAre("stuck"));
  release->Notify();  // the abandoned callback finishes; it must not settle anything
  AckAll(c.get(), again);
}

TEST_P(DriverConformanceTest, ReceiveMessageExtendsTheLeaseOfALongCallback) {
  const std::string q = Unique("q");
  ASSERT_TRUE(driver_->SendToQueue(q, "slow", absl::ZeroDuration()).ok());
  std::atomic<int> calls{0};
  absl::Notification release;
  ReceiveOptions options;
  options.poll_wait = harness_->ShortLease();
  options.lease = harness_->ShortLease() * 2;
  // Counts the keeper's renewals (Consumer::Extend).
  FaultyDriver counting(driver_);
  ReceiveLoop loop(&counting, q, options, [&](const Delivery&) {
    calls.fetch_add(1);
    release.WaitForNotification();
    return Settlement::Done();
  });
  ASSERT_TRUE(WaitUntil([&] { return calls.load() == 1; }));
  // The worker is in the callback; the one thread left waiting on the clock is the keeper.
  ASSERT_TRUE(WaitUntil([&] { return harness_->ClockWaiters() >= 1; }));
  // Three leases pass in small steps; the loop's keeper renews the lease each half lease: after
  // each half lease, wait for that renewal before time moves on.
  auto other = NewConsumer(q);
  for (int i = 1; i <= 12; ++i) {
    harness_->Advance(options.lease / 4);
    if (i % 2 == 0) {
      ASSERT_TRUE(WaitUntil([&] { return counting.extends.load() >= i / 2; }))
          << counting.extends.load() << " renewals after " << i << " quarter leases";
    }
  }
  EXPECT_THAT(Poll(other.get()), IsEmpty());
  release.Notify();
  auto& result = loop.Stop();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(result.get().ok());
  EXPECT_EQ(calls.load(), 1);
}

TEST_P(DriverConformanceTest, ReceiveMessageRejectsBadArguments) {
  ReceiveOptions options;
  std::stop_source stop;
  auto fn = [](const Delivery&) { return Settlement::Done(); };
  EXPECT_TRUE(
      absl::IsInvalidArgument(ReceiveMessage(*driver_, "bad name", options, fn, stop.get_token())));
  options.concurrency = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(
      ReceiveMessage(*driver_, Unique("q"), options, fn, stop.get_token())));
  options.concurrency = 4;
  options.max_in_flight = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(
      ReceiveMessage(*driver_, Unique("q"), options, fn, stop.get_token())));
  options.max_in_flight = 0;
  options.batch_size = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(
      ReceiveMessage(*driver_, Unique("q"), options, fn, stop.get_token())));
  options.batch_size = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(
      ReceiveBatches(*driver_, Unique("q"), options, nullptr, stop.get_token())));
}

}  // namespace

}  // namespace bus::testing
