// The schedules the NSQ driver's loops take from its Core: the lookupd poll waits a jittered
// interval, uniform in [interval/2, interval] (go-nsq's jitter), drawn from NsqOptions.random.

#include "drivers/nsq/internal/core.h"

#include <memory>

#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/random.h"
#include "drivers/nsq/nsq_options.h"
#include "gtest/gtest.h"

namespace bus::nsq {
namespace {

Core CoreWith(std::shared_ptr<RandomSource> random) {
  NsqOptions o;
  o.nsqd_tcp_addresses = {"127.0.0.1:4150"};
  o.discovery.lookupd_poll_interval = absl::Seconds(10);
  o.random = std::move(random);
  return Core(WithNsqDefaults(std::move(o)), nullptr);
}

TEST(CoreTest, LookupdPollsWaitAJitteredInterval) {
  // The lowest draw waits half the interval, the highest nearly all of it, every poll alike.
  Backoff low = CoreWith(FixedRandom(0)).LookupdPollSchedule();
  Backoff high = CoreWith(FixedRandom(0.999)).LookupdPollSchedule();
  for (int poll = 0; poll < 3; ++poll) {
    EXPECT_EQ(low.Next(), absl::Seconds(5)) << poll;
    EXPECT_EQ(high.Next(), absl::Milliseconds(9995)) << poll;
  }
}

}  // namespace
}  // namespace bus::nsq
