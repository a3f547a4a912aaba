// For the tests that a secret (a password, an auth token) appears in no log record or event:
// a check over a parsed JSON-lines record, and a logger that counts records by event while
// passing them on.

#ifndef TESTS_TESTING_SECRET_CHECKS_H_
#define TESTS_TESTING_SECRET_CHECKS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "bus/events.h"
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
  void Log(LogLevel level, absl::string_view line) override { next_->Log(level, line); }
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

}  // namespace bus::testing

#endif  // TESTS_TESTING_SECRET_CHECKS_H_
