#include "tests/store_conformance.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "tests/testing/letters.h"

namespace bus::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::string Unique(absl::string_view base) {
  static std::atomic<int> counter{0};
  return absl::StrCat(base, "-", getpid(), "-", counter.fetch_add(1));
}

std::vector<std::string> Datas(const std::vector<DeadLetter>& letters) {
  std::vector<std::string> out;
  for (const DeadLetter& l : letters) out.push_back(l.data);
  return out;
}

}  // namespace

void DeadLetterStoreConformanceTest::SetUp() {
  harness_ = GetParam().make();
  ASSERT_NE(harness_, nullptr);
  store_ = harness_->NewDeadLetterStore();
  ASSERT_NE(store_, nullptr);
}

void IdempotencyStoreConformanceTest::SetUp() {
  harness_ = GetParam().make();
  ASSERT_NE(harness_, nullptr);
  store_ = harness_->NewIdempotencyStore();
  ASSERT_NE(store_, nullptr);
}

namespace {

// ---- DeadLetterStore ----

TEST_P(DeadLetterStoreConformanceTest, PingAnswers) {
  EXPECT_TRUE(store_->Ping(absl::Seconds(5)).ok()) << store_->Ping(absl::Seconds(5));
}

TEST_P(DeadLetterStoreConformanceTest, StoreFetchRemoveCount) {
  const std::string q = Unique("q");
  const std::string binary("\0\x01\xff payload \0", 13);
  auto id1 = store_->Store(Letter(q, "first", "reason one"));
  auto id2 = store_->Store(Letter(q, binary, "reason two"));
  auto id3 = store_->Store(Letter(q, "third", ""));
  ASSERT_TRUE(id1.ok() && id2.ok() && id3.ok());
  EXPECT_NE(*id1, *id2);
  EXPECT_NE(*id2, *id3);
  EXPECT_EQ(*store_->Count(q), 3);

  auto letters = store_->Fetch(q, 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), 3u);
  EXPECT_THAT(Datas(*letters), ElementsAre("first", binary, "third"));  // oldest first
  EXPECT_EQ((*letters)[0].id, *id1);
  EXPECT_EQ((*letters)[0].queue, q);
  EXPECT_EQ((*letters)[0].reason, "reason one");
  EXPECT_EQ((*letters)[1].reason, "reason two");
  EXPECT_GT((*letters)[0].stored_at, absl::UnixEpoch());

  ASSERT_TRUE(store_->Remove(q, *id2).ok());
  EXPECT_TRUE(store_->Remove(q, *id2).ok());  // idempotent
  EXPECT_EQ(*store_->Count(q), 2);
  EXPECT_THAT(Datas(*store_->Fetch(q, 10)), ElementsAre("first", "third"));
}

TEST_P(DeadLetterStoreConformanceTest, FetchWalksAQueueInBoundedBatches) {
  const std::string q = Unique("q");
  for (int i = 0; i < 25; ++i)
    ASSERT_TRUE(store_->Store(Letter(q, absl::StrCat("m", i), "r")).ok());
  std::vector<std::string> all;
  std::string after;
  std::vector<size_t> sizes;
  while (true) {
    auto batch = store_->Fetch(q, 10, after);
    ASSERT_TRUE(batch.ok()) << batch.status();
    sizes.push_back(batch->size());
    if (batch->empty()) break;
    for (const DeadLetter& l : *batch) all.push_back(l.data);
    after = batch->back().id;
  }
  EXPECT_THAT(sizes, ElementsAre(10u, 10u, 5u, 0u));
  ASSERT_EQ(all.size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], absl::StrCat("m", i));
}

TEST_P(DeadLetterStoreConformanceTest, QueuesAreSeparateAndPurgeEmptiesOne) {
  const std::string a = Unique("a");
  const std::string b = Unique("b");
  ASSERT_TRUE(store_->Store(Letter(a, "a1", "r")).ok());
  ASSERT_TRUE(store_->Store(Letter(b, "b1", "r")).ok());
  ASSERT_TRUE(store_->Store(Letter(a, "a2", "r")).ok());
  EXPECT_THAT(Datas(*store_->Fetch(a, 10)), ElementsAre("a1", "a2"));
  EXPECT_THAT(Datas(*store_->Fetch(b, 10)), ElementsAre("b1"));
  ASSERT_TRUE(store_->Purge(a).ok());
  EXPECT_EQ(*store_->Count(a), 0);
  EXPECT_EQ(*store_->Count(b), 1);
  EXPECT_THAT(*store_->Fetch(a, 10), IsEmpty());
}

TEST_P(DeadLetterStoreConformanceTest, EmptyQueueAndBadLimit) {
  const std::string q = Unique("q");
  EXPECT_EQ(*store_->Count(q), 0);
  EXPECT_THAT(*store_->Fetch(q, 5), IsEmpty());
  EXPECT_TRUE(store_->Purge(q).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Fetch(q, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Fetch(q, -1).status()));
}

TEST_P(DeadLetterStoreConformanceTest, LargeBinaryLettersRoundTrip) {
  const std::string q = Unique("q");
  std::string big(256 * 1024, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 13 % 256);
  ASSERT_TRUE(store_->Store(Letter(q, big, std::string("why\0not", 7))).ok());
  auto letters = store_->Fetch(q, 1);
  ASSERT_TRUE(letters.ok());
  ASSERT_EQ(letters->size(), 1u);
  EXPECT_EQ((*letters)[0].data, big);
}

TEST_P(DeadLetterStoreConformanceTest, TwoStoreObjectsShareTheBackingState) {
  const std::string q = Unique("q");
  auto other = harness_->NewDeadLetterStore();
  auto id = store_->Store(Letter(q, "shared", "r"));
  ASSERT_TRUE(id.ok());
  EXPECT_THAT(Datas(*other->Fetch(q, 10)), ElementsAre("shared"));
  ASSERT_TRUE(other->Remove(q, *id).ok());
  EXPECT_EQ(*store_->Count(q), 0);
}

TEST_P(DeadLetterStoreConformanceTest, ConcurrentStoresAreAllKept) {
  const std::string q = Unique("q");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        EXPECT_TRUE(store_->Store(Letter(q, absl::StrCat(t, "-", i), "r")).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store_->Count(q), 100);
}

TEST_P(DeadLetterStoreConformanceTest, LettersKeepTheirKindAttemptsTimesAndReplays) {
  const std::string q = Unique("q");
  DeadLetter letter = Letter(q, "envelope", "declined", DeadLetterKind::kPermanent);
  letter.attempts = 3;
  letter.first_failed_at = absl::FromUnixMicros(1700000000123456);
  letter.last_failed_at = absl::FromUnixMicros(1700000009654321);
  letter.replays = 2;
  letter.id = "ignored";
  ASSERT_TRUE(store_->Store(letter).ok());
  auto letters = store_->Fetch(q, 10);
  ASSERT_TRUE(letters.ok()) << letters.status();
  ASSERT_EQ(letters->size(), 1u);
  const DeadLetter& got = (*letters)[0];
  EXPECT_NE(got.id, "ignored");
  EXPECT_EQ(got.kind, DeadLetterKind::kPermanent);
  EXPECT_EQ(got.attempts, 3);
  EXPECT_EQ(got.first_failed_at, letter.first_failed_at);
  EXPECT_EQ(got.last_failed_at, letter.last_failed_at);
  EXPECT_EQ(got.replays, 2);
  EXPECT_EQ(got.reason, "declined");
}

TEST_P(DeadLetterStoreConformanceTest, FetchCountAndPurgeFilterByKind) {
  const std::string q = Unique("q");
  const DeadLetterKind kinds[] = {DeadLetterKind::kExhausted, DeadLetterKind::kPermanent,
                                  DeadLetterKind::kMalformed};
  // e0 p1 m2 e3 p4 m5 ... e9: 4 exhausted, 3 permanent, 3 malformed, interleaved.
  for (int i = 0; i < 10; ++i) {
    const DeadLetterKind kind = i == 9 ? DeadLetterKind::kExhausted : kinds[i % 3];
    ASSERT_TRUE(
        store_->Store(Letter(q, absl::StrCat(DeadLetterKindName(kind).substr(0, 1), i), "r", kind))
            .ok());
  }
  EXPECT_EQ(*store_->Count(q), 10);
  EXPECT_EQ(*store_->Count(q, {DeadLetterKind::kExhausted}), 4);
  EXPECT_EQ(*store_->Count(q, {DeadLetterKind::kPermanent, DeadLetterKind::kMalformed}), 6);

  EXPECT_THAT(Datas(*store_->Fetch(q, 10, "", {DeadLetterKind::kExhausted})),
              ElementsAre("e0", "e3", "e6", "e9"));
  EXPECT_THAT(
      Datas(*store_->Fetch(q, 10, "", {DeadLetterKind::kPermanent, DeadLetterKind::kMalformed})),
      ElementsAre("p1", "m2", "p4", "m5", "p7", "m8"));
  // Walking one kind in batches.
  std::vector<std::string> walked;
  std::string after;
  while (true) {
    auto batch = store_->Fetch(q, 1, after, {DeadLetterKind::kPermanent});
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (batch->empty()) break;
    for (const DeadLetter& l : *batch) {
      EXPECT_EQ(l.kind, DeadLetterKind::kPermanent);
      walked.push_back(l.data);
    }
    after = batch->back().id;
  }
  EXPECT_THAT(walked, ElementsAre("p1", "p4", "p7"));
  // Two kinds, in batches smaller than what each kind holds: still oldest first, none skipped.
  walked.clear();
  after.clear();
  while (true) {
    auto batch =
        store_->Fetch(q, 2, after, {DeadLetterKind::kExhausted, DeadLetterKind::kMalformed});
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (batch->empty()) break;
    for (const DeadLetter& l : *batch) walked.push_back(l.data);
    after = batch->back().id;
  }
  EXPECT_THAT(walked, ElementsAre("e0", "m2", "e3", "m5", "e6", "m8", "e9"));

  ASSERT_TRUE(store_->Purge(q, {DeadLetterKind::kMalformed}).ok());
  EXPECT_EQ(*store_->Count(q), 7);
  EXPECT_EQ(*store_->Count(q, {DeadLetterKind::kMalformed}), 0);
  EXPECT_THAT(Datas(*store_->Fetch(q, 10)), ElementsAre("e0", "p1", "e3", "p4", "e6", "p7", "e9"));
  // Removing one letter takes it out of its kind too.
  auto exhausted = store_->Fetch(q, 1, "", {DeadLetterKind::kExhausted});
  ASSERT_TRUE(store_->Remove(q, (*exhausted)[0].id).ok());
  EXPECT_EQ(*store_->Count(q, {DeadLetterKind::kExhausted}), 3);
  EXPECT_THAT(Datas(*store_->Fetch(q, 10, "", {DeadLetterKind::kExhausted})),
              ElementsAre("e3", "e6", "e9"));
  ASSERT_TRUE(store_->Purge(q).ok());
  EXPECT_EQ(*store_->Count(q), 0);
  EXPECT_EQ(*store_->Count(q, {DeadLetterKind::kPermanent}), 0);
}

TEST_P(DeadLetterStoreConformanceTest, EveryKindIsKeptFetchedCountedAndPurgedOnItsOwn) {
  const std::string q = Unique("q");
  for (DeadLetterKind kind : kDeadLetterKinds) {
    ASSERT_TRUE(store_->Store(Letter(q, DeadLetterKindName(kind), "r", kind)).ok());
  }
  EXPECT_EQ(*store_->Count(q), static_cast<int64_t>(std::size(kDeadLetterKinds)));
  for (DeadLetterKind kind : kDeadLetterKinds) {
    EXPECT_EQ(*store_->Count(q, {kind}), 1) << DeadLetterKindName(kind);
    absl::StatusOr<std::vector<DeadLetter>> one = store_->Fetch(q, 10, "", {kind});
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_EQ(one->size(), 1u) << DeadLetterKindName(kind);
    EXPECT_EQ((*one)[0].kind, kind);
    EXPECT_EQ((*one)[0].data, DeadLetterKindName(kind));
  }
  ASSERT_TRUE(store_->Purge(q, {DeadLetterKind::kPoison}).ok());
  EXPECT_EQ(*store_->Count(q, {DeadLetterKind::kPoison}), 0);
  EXPECT_EQ(*store_->Count(q), static_cast<int64_t>(std::size(kDeadLetterKinds)) - 1);
}

TEST_P(DeadLetterStoreConformanceTest, StoringALetterOfTheSameMessageAndAttemptsAgainIsANoOp) {
  const std::string q = Unique("q");
  DeadLetter letter = Letter(q, "v1", "r");
  letter.message_id = "m-1";
  letter.attempts = 2;
  auto first = store_->Store(letter);
  ASSERT_TRUE(first.ok()) << first.status();
  letter.data = "v1 again";
  auto again = store_->Store(letter);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(*store_->Count(q), 1);
  // Another attempt of the same message, another message, and malformed letters (no message
  // id) are letters of their own.
  letter.attempts = 3;
  auto third = store_->Store(letter);
  letter.message_id = "m-2";
  auto other = store_->Store(letter);
  ASSERT_TRUE(store_->Store(Letter(q, "raw", "malformed: x", DeadLetterKind::kMalformed)).ok());
  ASSERT_TRUE(store_->Store(Letter(q, "raw", "malformed: x", DeadLetterKind::kMalformed)).ok());
  ASSERT_TRUE(third.ok() && other.ok());
  EXPECT_NE(*third, *first);
  EXPECT_NE(*other, *third);
  EXPECT_EQ(*store_->Count(q), 5);
  auto letters = store_->Fetch(q, 10);
  ASSERT_TRUE(letters.ok());
  EXPECT_EQ((*letters)[0].data, "v1");
  EXPECT_EQ((*letters)[0].message_id, "m-1");
  EXPECT_EQ((*letters)[3].message_id, "");
  // Once removed, the same message and attempts may be stored again.
  ASSERT_TRUE(store_->Remove(q, *first).ok());
  letter.message_id = "m-1";
  letter.attempts = 2;
  auto back = store_->Store(letter);
  ASSERT_TRUE(back.ok());
  EXPECT_NE(*back, *first);
  ASSERT_TRUE(store_->Purge(q).ok());
  auto after_purge = store_->Store(letter);
  ASSERT_TRUE(after_purge.ok());
  EXPECT_NE(*after_purge, *back);
  EXPECT_EQ(*store_->Count(q), 1);
}

// A topic message reaches several queues with one message id: each queue's letter of it is a
// letter of its own, however the store indexes letters by message.
TEST_P(DeadLetterStoreConformanceTest, TheSameMessageInTwoQueuesIsTwoLetters) {
  const std::string a = Unique("a");
  const std::string b = Unique("b");
  DeadLetter letter = Letter(a, "copy", "r");
  letter.message_id = "m-shared";
  letter.attempts = 3;
  auto in_a = store_->Store(letter);
  letter.queue = b;
  auto in_b = store_->Store(letter);
  ASSERT_TRUE(in_a.ok() && in_b.ok()) << in_a.status() << " " << in_b.status();
  EXPECT_EQ(*store_->Count(a), 1);
  EXPECT_EQ(*store_->Count(b), 1);
  ASSERT_TRUE(store_->Remove(a, *in_a).ok());
  EXPECT_EQ(*store_->Count(b), 1);
  auto letters = store_->Fetch(b, 10);
  ASSERT_TRUE(letters.ok());
  ASSERT_EQ(letters->size(), 1u);
  EXPECT_EQ((*letters)[0].message_id, "m-shared");
}

TEST_P(DeadLetterStoreConformanceTest, BadLettersAndFiltersAreRefused) {
  const std::string q = Unique("q");
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Store(Letter("", "d", "r")).status()));
  DeadLetter negative = Letter(q, "d", "r");
  negative.attempts = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Store(negative).status()));
  negative.attempts = 0;
  negative.replays = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Store(negative).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Fetch(q, 1, "", DeadLetterKinds{}).status()));
  EXPECT_EQ(*store_->Count(q), 0);
}

// ---- IdempotencyStore ----

TEST_P(IdempotencyStoreConformanceTest, PingAnswers) {
  EXPECT_TRUE(store_->Ping(absl::Seconds(5)).ok()) << store_->Ping(absl::Seconds(5));
}

TEST_P(IdempotencyStoreConformanceTest, OnlyOneOwnerHoldsAKey) {
  const std::string key = Unique("k");
  const absl::Duration lease = harness_->ShortLease() * 10;
  EXPECT_TRUE(*store_->Acquire(key, "a", lease));
  EXPECT_FALSE(*store_->Acquire(key, "b", lease));
  EXPECT_FALSE(*store_->Acquire(key, "a", lease));         // a live lease is not re-granted
  EXPECT_TRUE(*store_->Acquire(Unique("k"), "b", lease));  // other keys are independent
}

TEST_P(IdempotencyStoreConformanceTest, DoneKeysStayTakenForTheRetention) {
  const std::string key = Unique("k");
  const absl::Duration lease = harness_->ShortLease();
  const absl::Duration retention = harness_->ShortLease() * 2;
  ASSERT_TRUE(*store_->Acquire(key, "a", lease));
  ASSERT_TRUE(store_->MarkDone(key, "a", retention).ok());
  harness_->Advance(lease * 3 / 2);  // past the lease, within the retention
  EXPECT_FALSE(*store_->Acquire(key, "b", lease));
  // Done is not a live lease: the former owner can no longer release or mark it.
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Release(key, "a")));
  harness_->Advance(retention);
  EXPECT_TRUE(*store_->Acquire(key, "b", lease));
}

TEST_P(IdempotencyStoreConformanceTest, ReleaseGivesTheKeyBack) {
  const std::string key = Unique("k");
  const absl::Duration lease = harness_->ShortLease() * 10;
  ASSERT_TRUE(*store_->Acquire(key, "a", lease));
  ASSERT_TRUE(store_->Release(key, "a").ok());
  EXPECT_TRUE(*store_->Acquire(key, "b", lease));
}

TEST_P(IdempotencyStoreConformanceTest, AnExpiredLeaseCanBeTakenAndTheStaleOwnerIsRefused) {
  const std::string key = Unique("k");
  const absl::Duration lease = harness_->ShortLease();
  ASSERT_TRUE(*store_->Acquire(key, "stale", lease));
  harness_->Advance(lease * 2);
  ASSERT_TRUE(*store_->Acquire(key, "fresh", lease * 10));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->MarkDone(key, "stale", lease * 10)));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Release(key, "stale")));
  // The fresh owner's lease was untouched by the stale worker.
  EXPECT_FALSE(*store_->Acquire(key, "third", lease));
  EXPECT_TRUE(store_->MarkDone(key, "fresh", lease * 10).ok());
  EXPECT_FALSE(*store_->Acquire(key, "third", lease));
}

TEST_P(IdempotencyStoreConformanceTest, AnExpiredLeaseWithNoSuccessorIsRefusedToo) {
  const std::string key = Unique("k");
  const absl::Duration lease = harness_->ShortLease();
  ASSERT_TRUE(*store_->Acquire(key, "slow", lease));
  harness_->Advance(lease * 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->MarkDone(key, "slow", lease * 10)));
  EXPECT_TRUE(*store_->Acquire(key, "next", lease));
}

TEST_P(IdempotencyStoreConformanceTest, AcquireReportingNamesTheOwnerOfALeaseThatRanOut) {
  const std::string key = Unique("k");
  const absl::Duration lease = harness_->ShortLease();
  AcquireReport report;
  // A free key: nothing ran out.
  ASSERT_TRUE(*store_->AcquireReporting(key, "first", lease, &report));
  EXPECT_TRUE(report.reported);
  EXPECT_EQ(report.lapsed_owner, "");
  // Its lease runs out unreleased (the holder died): the next acquire takes it over from it.
  harness_->Advance(lease * 2);
  ASSERT_TRUE(*store_->AcquireReporting(key, "second", lease * 10, &report));
  EXPECT_TRUE(report.reported);
  EXPECT_EQ(report.lapsed_owner, "first");
  // Held by a live lease: not acquired, nothing reported.
  EXPECT_FALSE(*store_->AcquireReporting(key, "third", lease, &report));
  EXPECT_EQ(report.lapsed_owner, "");
  // Released: free, and nothing ran out.
  ASSERT_TRUE(store_->Release(key, "second").ok());
  ASSERT_TRUE(*store_->AcquireReporting(key, "fourth", lease * 10, &report));
  EXPECT_EQ(report.lapsed_owner, "");
  // Done: taken while retained; past the retention free again, and a done key never ran out.
  ASSERT_TRUE(store_->MarkDone(key, "fourth", lease).ok());
  EXPECT_FALSE(*store_->AcquireReporting(key, "fifth", lease, &report));
  EXPECT_EQ(report.lapsed_owner, "");
  harness_->Advance(lease * 2);
  ASSERT_TRUE(*store_->AcquireReporting(key, "sixth", lease, &report));
  EXPECT_EQ(report.lapsed_owner, "");
  // A plain Acquire takes a lease that ran out over too, and the contract is the same.
  harness_->Advance(lease * 2);
  EXPECT_TRUE(*store_->Acquire(key, "seventh", lease));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->AcquireReporting("", "a", lease, &report).status()));
}

TEST_P(IdempotencyStoreConformanceTest, NonOwnersCannotReleaseOrMarkDone) {
  const std::string key = Unique("k");
  const absl::Duration lease = harness_->ShortLease() * 10;
  ASSERT_TRUE(*store_->Acquire(key, "owner", lease));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Release(key, "intruder")));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->MarkDone(key, "intruder", lease)));
  EXPECT_FALSE(*store_->Acquire(key, "intruder", lease));  // still held by the owner
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Release(Unique("never"), "owner")));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->MarkDone(Unique("never"), "owner", lease)));
  EXPECT_TRUE(store_->Release(key, "owner").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Release(key, "owner")));  // once only
}

TEST_P(IdempotencyStoreConformanceTest, BadArgumentsAreInvalidArgument) {
  const absl::Duration lease = harness_->ShortLease();
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Acquire("", "a", lease).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Acquire("k", "", lease).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Acquire("k", "a", absl::ZeroDuration()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->MarkDone("", "a", lease)));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Release("k", "")));
}

TEST_P(IdempotencyStoreConformanceTest, BatchedCallsMatchTheSingleCallsInOrder) {
  const std::string a = Unique("k"), b = Unique("k"), held = Unique("k");
  const absl::Duration lease = harness_->ShortLease() * 10;
  ASSERT_TRUE(*store_->Acquire(held, "other", lease));

  // A repeated key finds it taken by the earlier entry; a bad entry fails alone.
  const std::vector<absl::string_view> keys = {a, b, a, held, ""};
  const std::vector<absl::string_view> owners = {"o1", "o2", "o3", "o4", "o5"};
  std::vector<absl::StatusOr<bool>> got(keys.size(), false);
  store_->AcquireMany(keys, owners, lease, absl::MakeSpan(got));
  ASSERT_TRUE(got[0].ok() && got[1].ok() && got[2].ok() && got[3].ok());
  EXPECT_TRUE(*got[0]);
  EXPECT_TRUE(*got[1]);
  EXPECT_FALSE(*got[2]);
  EXPECT_FALSE(*got[3]);
  EXPECT_TRUE(absl::IsInvalidArgument(got[4].status())) << got[4].status();

  // Only the owners of live leases mark done; the others are refused and change nothing.
  const std::vector<absl::string_view> done_keys = {a, held, b, a, ""};
  const std::vector<absl::string_view> done_owners = {"o1", "o4", "o2", "o3", "o1"};
  std::vector<absl::Status> done(done_keys.size());
  store_->MarkDoneMany(done_keys, done_owners, lease, absl::MakeSpan(done));
  EXPECT_TRUE(done[0].ok()) << done[0];
  EXPECT_TRUE(absl::IsFailedPrecondition(done[1])) << done[1];
  EXPECT_TRUE(done[2].ok()) << done[2];
  EXPECT_TRUE(absl::IsFailedPrecondition(done[3])) << done[3];
  EXPECT_TRUE(absl::IsInvalidArgument(done[4])) << done[4];
  EXPECT_FALSE(*store_->Acquire(a, "later", lease));  // done
  EXPECT_FALSE(*store_->Acquire(b, "later", lease));  // done
  EXPECT_TRUE(store_->Release(held, "other").ok());   // still the other's live lease

  // A bad lease or retention is refused per entry.
  const std::vector<absl::string_view> fresh = {Unique("k")};
  const std::vector<absl::string_view> one_owner = {"o"};
  std::vector<absl::StatusOr<bool>> bad(1, false);
  store_->AcquireMany(fresh, one_owner, absl::ZeroDuration(), absl::MakeSpan(bad));
  EXPECT_TRUE(absl::IsInvalidArgument(bad[0].status()));
  std::vector<absl::Status> bad_done(1);
  store_->MarkDoneMany(fresh, one_owner, absl::ZeroDuration(), absl::MakeSpan(bad_done));
  EXPECT_TRUE(absl::IsInvalidArgument(bad_done[0]));
}

TEST_P(IdempotencyStoreConformanceTest, KeysAreBinarySafeStrings) {
  const std::string key = Unique("orders.") + std::string("\0\xff", 2);
  const std::string other = Unique("orders.") + std::string("\0\xfe", 2);
  const absl::Duration lease = harness_->ShortLease() * 10;
  EXPECT_TRUE(*store_->Acquire(key, "a", lease));
  EXPECT_TRUE(*store_->Acquire(other, "a", lease));
  EXPECT_TRUE(store_->MarkDone(key, "a", lease).ok());
}

TEST_P(IdempotencyStoreConformanceTest, TwoStoreObjectsShareTheBackingState) {
  const std::string key = Unique("k");
  auto other = harness_->NewIdempotencyStore();
  const absl::Duration lease = harness_->ShortLease() * 10;
  ASSERT_TRUE(*store_->Acquire(key, "a", lease));
  EXPECT_FALSE(*other->Acquire(key, "b", lease));
  EXPECT_TRUE(absl::IsFailedPrecondition(other->Release(key, "b")));
  EXPECT_TRUE(other->MarkDone(key, "a", lease).ok());
}

// Threads acquiring the same keys at once, one call per key, then in batches of every key in
// different orders (a store that locks parts of its keys must neither grant a key twice nor
// deadlock): each key is granted once, and each winner marks its keys done.
TEST_P(IdempotencyStoreConformanceTest, ConcurrentAcquiresGrantEachKeyOnce) {
  constexpr int kKeys = 64;
  constexpr int kThreads = 4;
  const absl::Duration lease = harness_->ShortLease() * 10;
  for (const bool batched : {false, true}) {
    SCOPED_TRACE(batched ? "batched" : "one call per key");
    std::vector<std::string> keys;
    for (int i = 0; i < kKeys; ++i) keys.push_back(Unique("k"));
    std::vector<std::atomic<int>> winners(kKeys);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const std::string owner = absl::StrCat("w", t);
        std::vector<absl::string_view> order, won;
        for (int i = 0; i < kKeys; ++i) {
          // Thread t starts at key 16 t, odd threads backwards.
          order.push_back(
              keys[static_cast<size_t>((t % 2 == 0 ? i + 16 * t : 16 * t - i + kKeys) % kKeys)]);
        }
        const std::vector<absl::string_view> owners(order.size(), owner);
        std::vector<absl::StatusOr<bool>> got(order.size(), false);
        if (batched) {
          store_->AcquireMany(order, owners, lease, absl::MakeSpan(got));
        } else {
          for (size_t i = 0; i < order.size(); ++i)
            got[i] = store_->Acquire(order[i], owner, lease);
        }
        for (size_t i = 0; i < order.size(); ++i) {
          ASSERT_TRUE(got[i].ok()) << got[i].status();
          if (!*got[i]) continue;
          won.push_back(order[i]);
          winners[static_cast<size_t>(std::find(keys.begin(), keys.end(), order[i]) - keys.begin())]
              .fetch_add(1);
        }
        std::vector<absl::Status> done(won.size());
        store_->MarkDoneMany(won, std::vector<absl::string_view>(won.size(), owner), lease,
                             absl::MakeSpan(done));
        for (const absl::Status& st : done) EXPECT_TRUE(st.ok()) << st;
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kKeys; ++i) EXPECT_EQ(winners[static_cast<size_t>(i)].load(), 1) << i;
  }
}

}  // namespace
}  // namespace bus::testing
