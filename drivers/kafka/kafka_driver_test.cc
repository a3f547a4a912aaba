// The Kafka driver's own behaviour beyond the conformance suite, against one real Kafka node
// started by this binary: bad input (a missing topic with topic creation off, a record too
// large, a port that is not Kafka, no broker at start), deletion, and inspection details.

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "drivers/kafka/kafka_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/kafka_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

std::string Name(absl::string_view base) {
  static int counter = 0;
  return absl::StrCat(base, "-", getpid(), "-", ++counter);
}

std::shared_ptr<Driver> NewDriver(KafkaOptions options = {}) {
  KafkaServer* server = SharedKafkaServer();
  if (server == nullptr) return nullptr;
  options.brokers = {server->bootstrap()};
  absl::StatusOr<std::shared_ptr<Driver>> driver = NewKafkaDriver(options);
  EXPECT_TRUE(driver.ok()) << driver.status();
  return driver.ok() ? *driver : nullptr;
}

TEST(KafkaDriverTest, DeleteQueueThenSendStartsAfresh) {
  absl::Time t0 = absl::Now();
  std::shared_ptr<Driver> d = NewDriver();
  ASSERT_NE(d, nullptr);
  fprintf(stderr, "DBG start %s\n", absl::FormatDuration(absl::Now()-t0).c_str());
  const std::string q = Name("del");
  ASSERT_TRUE(d->SendToQueue(q, "old", absl::ZeroDuration()).ok());
  fprintf(stderr, "DBG sent %s\n", absl::FormatDuration(absl::Now()-t0).c_str());
  absl::Status st = d->DeleteQueue(q);
  fprintf(stderr, "DBG deleted %s\n", absl::FormatDuration(absl::Now()-t0).c_str());
  EXPECT_TRUE(st.ok()) << st;
  st = d->DeleteQueue(q);
  EXPECT_TRUE(st.ok()) << st;
  st = d->SendToQueue(q, "fresh", absl::ZeroDuration());
  EXPECT_TRUE(st.ok()) << st;
}

TEST(KafkaDriverTest, InFlightSeenByAnother) {
  std::shared_ptr<Driver> d = NewDriver();
  std::shared_ptr<Driver> other = NewDriver();
  const std::string q = Name("insp");
  for (const char* m : {"a", "b", "c"}) ASSERT_TRUE(d->SendToQueue(q, m, absl::ZeroDuration()).ok());
  ASSERT_TRUE(d->SendToQueue(q, "later", absl::Hours(1)).ok());
  ASSERT_TRUE(d->SendToQueue(q, "soon", absl::Seconds(1)).ok());
  for (int i = 0; i < 5; ++i) {
    absl::Time t = absl::Now();
    auto counts = other->InspectQueue(q);
    fprintf(stderr, "DBG before %s %lld %lld %lld in %s\n", counts.status().ToString().c_str(),
            (long long)counts->ready, (long long)counts->delayed, (long long)counts->in_flight,
            absl::FormatDuration(absl::Now() - t).c_str());
    absl::SleepFor(absl::Milliseconds(300));
  }
  auto c = d->NewConsumer(q, ConsumerOptions{1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok());
  std::vector<Delivery> out;
  while (out.empty()) ASSERT_TRUE((*c)->Receive(1, absl::Seconds(1), {}, &out).ok());
  for (int i = 0; i < 10; ++i) {
    absl::Time t = absl::Now();
    auto counts = other->InspectQueue(q);
    auto mine = d->InspectQueue(q);
    fprintf(stderr, "DBG other %s %lld %lld %lld mine %lld %lld %lld in %s\n", counts.status().ToString().c_str(),
            (long long)counts->ready, (long long)counts->delayed, (long long)counts->in_flight,
            (long long)mine->ready, (long long)mine->delayed, (long long)mine->in_flight,
            absl::FormatDuration(absl::Now() - t).c_str());
    absl::SleepFor(absl::Milliseconds(300));
  }
}

}  // namespace
}  // namespace bus::testing
