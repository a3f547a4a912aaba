#include "tests/testing/stream_check.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bus/backoff.h"

namespace bus::testing {

StreamCheck::StreamCheck(std::shared_ptr<Driver> producer, std::shared_ptr<Driver> consumer,
                         std::string queue, int messages)
    : producer_(std::move(producer)),
      consumer_(std::move(consumer)),
      queue_(std::move(queue)),
      messages_(messages) {
  producer_thread_ = std::thread([this] { Produce(); });
  consumer_thread_ = std::thread([this] { Consume(); });
}

StreamCheck::~StreamCheck() {
  stop_.store(true);
  if (producer_thread_.joinable()) producer_thread_.join();
  if (consumer_thread_.joinable()) consumer_thread_.join();
}

int StreamCheck::confirmed() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(confirmed_.size());
}

int StreamCheck::seen() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(seen_.size());
}

void StreamCheck::Produce() {
  Backoff backoff({.initial = absl::Milliseconds(20), .max = absl::Milliseconds(500)});
  for (int i = 0; i < messages_ && !stop_.load(); ++i) {
    while (!stop_.load()) {
      if (producer_->SendToQueue(queue_, absl::StrCat(i), absl::ZeroDuration()).ok()) {
        backoff.Reset();
        absl::MutexLock lock(&mu_);
        confirmed_.insert(i);
        break;
      }
      SleepAfterFailure(*RealClock(), backoff);
    }
  }
}

void StreamCheck::Consume() {
  Backoff backoff({.initial = absl::Milliseconds(20), .max = absl::Milliseconds(500)});
  std::unique_ptr<Consumer> c;
  while (!stop_.load()) {
    if (c == nullptr) {
      auto made = consumer_->NewConsumer(queue_, ConsumerOptions{64, absl::Seconds(30)});
      if (!made.ok()) {
        SleepAfterFailure(*RealClock(), backoff);
        continue;
      }
      c = std::move(*made);
    }
    std::vector<Delivery> got;
    if (!c->Receive(64, absl::Milliseconds(200), {}, &got).ok()) {
      SleepAfterFailure(*RealClock(), backoff);
      continue;
    }
    backoff.Reset();
    for (const Delivery& d : got) {
      int id = -1;
      if (absl::SimpleAtoi(d.data, &id)) {
        absl::MutexLock lock(&mu_);
        seen_.insert(id);
        arrivals_.push_back(absl::Now());
      }
      static_cast<void>(c->Ack(d.receipt));  // a lost lease is redelivered: counted once
    }
  }
}

std::vector<int> StreamCheck::Finish(absl::Duration patience) {
  {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (static_cast<int>(confirmed_.size()) < messages_) return false;
      return std::includes(seen_.begin(), seen_.end(), confirmed_.begin(), confirmed_.end());
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), patience);
  }
  stop_.store(true);
  producer_thread_.join();
  consumer_thread_.join();
  absl::MutexLock lock(&mu_);
  std::vector<int> missing;
  std::set_difference(confirmed_.begin(), confirmed_.end(), seen_.begin(), seen_.end(),
                      std::back_inserter(missing));
  return missing;
}

absl::Duration StreamCheck::ResumedAfter(absl::Time t) const {
  absl::MutexLock lock(&mu_);
  for (absl::Time a : arrivals_) {
    if (a > t) return a - t;
  }
  return absl::InfiniteDuration();
}

}  // namespace bus::testing
