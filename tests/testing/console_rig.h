// ConsoleRig: a running Handler on one queue with the admin server's console in front of it,
// for the console's API and browser tests (admin/console_test.cc, admin/console_browser_test.cc).
//
// The handler of queue "orders" succeeds, except for a payload that starts with "fail": that
// fails permanently with the reason "declined: <payload's first 200 bytes>", so it lands in the
// dead letters at once; after Heal() every message succeeds (a replay is then handled). The
// driver and stores are the memory ones unless the options give others.
//
// Thread-safety: one test thread uses a rig; the handler runs on a thread of its own.

#ifndef TESTS_TESTING_CONSOLE_RIG_H_
#define TESTS_TESTING_CONSOLE_RIG_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "admin/admin_server.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/wait.h"

namespace bus::testing {

struct ConsoleRigOptions {
  std::string queue = "orders";
  std::string write_token{};
  absl::Duration sample_interval = absl::Milliseconds(200);
  // The console's clock (default real time).
  std::shared_ptr<Clock> console_clock{};
  std::shared_ptr<Driver> driver{};
  std::shared_ptr<DeadLetterStore> dead_letters{};
  std::shared_ptr<IdempotencyStore> idempotency{};
};

class ConsoleRig {
 public:
  explicit ConsoleRig(ConsoleRigOptions o = {}) : queue_(o.queue) {
    driver_ = o.driver != nullptr ? o.driver : NewMemoryDriver();
    dead_letters_ = o.dead_letters != nullptr ? o.dead_letters : NewMemoryDeadLetterStore();
    HandlerOptions h;
    h.queue = o.queue;
    h.driver = driver_;
    h.stores.dead_letters = dead_letters_;
    h.stores.idempotency = o.idempotency != nullptr ? o.idempotency : NewMemoryIdempotencyStore();
    h.replay.interval = absl::ZeroDuration();
    h.handle = [this](const Message& m) -> absl::Status {
      if (!healed_.load() && absl::StartsWith(m.payload, "fail")) {
        return Permanent(absl::InternalError(absl::StrCat("declined: ", m.payload.substr(0, 200))));
      }
      return absl::OkStatus();
    };
    absl::StatusOr<std::unique_ptr<Handler>> created = Handler::Create(std::move(h));
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return;
    handler_ = std::move(*created);
    thread_ = std::thread([this] { handler_->Run().IgnoreError(); });
    EXPECT_TRUE(handler_->WaitUntilRunning(absl::Seconds(60)).ok());
    AdminServerOptions a;
    a.handlers = {handler_.get()};
    a.console.enabled = true;
    a.console.handlers = {handler_.get()};
    a.console.write_token = o.write_token;
    a.console.sample_interval = o.sample_interval;
    a.console.clock = o.console_clock;
    absl::StatusOr<std::unique_ptr<AdminServer>> admin = AdminServer::Start(std::move(a));
    EXPECT_TRUE(admin.ok()) << admin.status();
    if (admin.ok()) admin_ = std::move(*admin);
  }

  ~ConsoleRig() {
    if (admin_ != nullptr) admin_->Stop();
    if (handler_ != nullptr) handler_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  ConsoleRig(const ConsoleRig&) = delete;
  ConsoleRig& operator=(const ConsoleRig&) = delete;

  // Sends a message to the queue; returns its id.
  std::string Send(Outgoing out) {
    absl::StatusOr<std::string> id =
        Publisher::Create(driver_)->SendToQueue(queue_, std::move(out));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }

  // Waits until the handler has handled `handled` and dead-lettered `dead` messages in all and
  // holds none.
  bool WaitFor(uint64_t handled, uint64_t dead) {
    return WaitUntil(
        [&] {
          const HandlerStats s = handler_->Stats();
          return s.succeeded == handled && s.dead_lettered == dead && s.in_flight == 0;
        },
        absl::Seconds(60));
  }

  void Heal() { healed_.store(true); }

  std::string Url(absl::string_view path) const {
    return absl::StrCat("http://127.0.0.1:", admin_->port(), path);
  }

  const std::string& queue() const { return queue_; }
  Handler* handler() const { return handler_.get(); }
  AdminServer* admin() const { return admin_.get(); }
  const std::shared_ptr<Driver>& driver() const { return driver_; }
  const std::shared_ptr<DeadLetterStore>& dead_letters() const { return dead_letters_; }

 private:
  std::string queue_;
  std::shared_ptr<Driver> driver_;
  std::shared_ptr<DeadLetterStore> dead_letters_;
  std::atomic<bool> healed_{false};
  std::unique_ptr<Handler> handler_;
  std::thread thread_;
  std::unique_ptr<AdminServer> admin_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_CONSOLE_RIG_H_
