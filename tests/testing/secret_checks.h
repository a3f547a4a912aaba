// For the tests that a secret (a password, an auth token) appears in no log record or event:
// a check over a parsed JSON-lines record, a logger that counts records by event while passing
// them on, a log of observer events, and the Handler those tests run through an outage.

#ifndef TESTS_TESTING_SECRET_CHECKS_H_
#define TESTS_TESTING_SECRET_CHECKS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "bus/events.h"
#include "bus/handler.h"
#include "bus/logger.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace bus::testing {

// Fails the test if any key or string in `j` contains `secret`.
inline void ExpectNoSecret(const nlohmann::json& j, absl::string_view secret,
                           const std::string& where) {
  if (j.is_string()) {
    EXPECT_FALSE(absl::StrContains(j.get<std::string>(), secret)) << where;
  } else if (j.is_structured()) {
    for (const auto& [key, value] : j.items()) {
      EXPECT_FALSE(absl::StrContains(key, secret)) << where;
      ExpectNoSecret(value, secret, where);
    }
  }
}

// Parses JSON-lines records; fails the test for a line that is not JSON or that contains
// `secret` anywhere (raw, or in a key or string once parsed). The records that parsed.
inline std::vector<nlohmann::json> RecordsWithoutSecret(const std::vector<std::string>& lines,
                                                        absl::string_view secret) {
  std::vector<nlohmann::json> records;
  for (const std::string& line : lines) {
    EXPECT_FALSE(absl::StrContains(line, secret)) << line;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      ADD_FAILURE() << "not JSON: " << line;
      continue;
    }
    ExpectNoSecret(j, secret, line);
    records.push_back(std::move(j));
  }
  return records;
}

// Fails the test if any text field of `e` contains `secret`.
inline void ExpectNoSecret(const Event& e, absl::string_view secret) {
  for (const std::string* f :
       {&e.queue, &e.message_id, &e.biz_uid, &e.trace_id, &e.error, &e.detail}) {
    EXPECT_FALSE(absl::StrContains(*f, secret)) << EventTypeName(e.type);
  }
}

// Forwards to another logger and counts the records of each event.
class CountingLogger final : public Logger {
 public:
  explicit CountingLogger(std::shared_ptr<Logger> next) : next_(std::move(next)) {}
  void Write(const LogRecord& r) override {
    {
      absl::MutexLock lock(&mu_);
      ++counts_[std::string(r.event)];
    }
    next_->Write(r);
  }
  int Count(absl::string_view event) const {
    absl::MutexLock lock(&mu_);
    auto it = counts_.find(std::string(event));
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  const std::shared_ptr<Logger> next_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
};

// Keeps every event the observer was given.
class EventLog {
 public:
  EventObserverFn Observer() {
    return [this](const Event& e) {
      absl::MutexLock lock(&mu_);
      events_.push_back(e);
    };
  }
  std::vector<Event> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  std::vector<Event> Of(EventType type) const {
    std::vector<Event> out;
    for (Event& e : events()) {
      if (e.type == type) out.push_back(std::move(e));
    }
    return out;
  }
  size_t Count(EventType type) const { return Of(type).size(); }

 private:
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

// A Handler on queue "orders" whose handle fails each message's first attempt and succeeds on
// the retry (sent again at once), with short infrastructure backoffs, no replay loop, and its
// events into `events`.
inline HandlerOptions FailFirstAttemptOptions(std::shared_ptr<Driver> driver,
                                              std::shared_ptr<DeadLetterStore> dead_letters,
                                              std::shared_ptr<IdempotencyStore> idempotency,
                                              std::shared_ptr<Logger> logger, EventLog* events) {
  HandlerOptions h;
  h.queue = "orders";
  h.driver = std::move(driver);
  h.stores.dead_letters = std::move(dead_letters);
  h.stores.idempotency = std::move(idempotency);
  h.observability.logger = std::move(logger);
  h.replay.interval = absl::ZeroDuration();
  h.infra_backoff.initial = absl::Milliseconds(10);
  h.infra_backoff.max = absl::Milliseconds(100);
  h.retry_delay = FixedBackoff(absl::ZeroDuration());
  h.handle = [](const Message& m) -> absl::Status {
    if (m.retried == 0) return absl::UnavailableError("first attempt fails");
    return absl::OkStatus();
  };
  h.observability.observer = events->Observer();
  return h;
}

}  // namespace bus::testing

#endif  // TESTS_TESTING_SECRET_CHECKS_H_
