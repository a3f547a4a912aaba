// StreamCheck: a producer and a consumer running over drivers while a test breaks the broker
// (kills it, restarts it, kills a cluster node), and the count afterwards: which confirmed
// messages never arrived, and how long consumption stopped. The producer sends "0", "1", ...
// one at a time, retrying each until the driver confirms it (a retry may duplicate it: counted
// once); the consumer acks what it receives and opens a new consumer when its own fails.
//
//   StreamCheck stream(producer_driver, consumer_driver, "orders", 2000);
//   ASSERT_TRUE(WaitUntil([&] { return stream.seen() >= 500; }));
//   const absl::Time killed = absl::Now();
//   broker->Stop(9);
//   ...
//   EXPECT_THAT(stream.Finish(absl::Seconds(120)), IsEmpty());   // confirmed, never received
//   absl::Duration gap = stream.ResumedAfter(killed);
//
// Thread-safety: the accessors are safe from any thread.

#ifndef TESTS_TESTING_STREAM_CHECK_H_
#define TESTS_TESTING_STREAM_CHECK_H_

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/driver.h"

namespace bus::testing {

class StreamCheck {
 public:
  StreamCheck(std::shared_ptr<Driver> producer, std::shared_ptr<Driver> consumer, std::string queue,
              int messages);
  ~StreamCheck();

  int confirmed() const;
  int seen() const;

  // Waits until every message was confirmed and every confirmed one received, for at most
  // `patience`; stops both threads and returns the confirmed messages never received.
  std::vector<int> Finish(absl::Duration patience);

  // How long after `t` the first message arrived (InfiniteDuration: none did).
  absl::Duration ResumedAfter(absl::Time t) const;

 private:
  void Produce();
  void Consume();

  const std::shared_ptr<Driver> producer_, consumer_;
  const std::string queue_;
  const int messages_;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::set<int> confirmed_ ABSL_GUARDED_BY(mu_);
  std::set<int> seen_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> arrivals_ ABSL_GUARDED_BY(mu_);
  std::thread producer_thread_, consumer_thread_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_STREAM_CHECK_H_
