// PostgresOutboxRelay: sends the messages that PostgreSQL inbox transactions published
// (PostgresTransaction::SendToQueue, PublishToTopic; rows of the table outbox) to the broker,
// in seq order, and deletes each row once the broker accepted it. A Handler on a PostgresInbox
// runs one while it consumes (PostgresInboxOptions::relay_in_handler); a service that only
// publishes runs one itself:
//
//   auto relay = std::make_shared<bus::PostgresOutboxRelay>(db, driver, logger);
//   std::jthread thread([relay](std::stop_token stop) { relay->Run(stop); });
//
// The relay works on a session of its own: it holds a session advisory lock, so that one relay
// per database and schema sends at a time (the others try again after a backoff, taking over
// when its session ends),
// and LISTENs on the outbox's channel, which each inbox transaction that wrote rows notifies at
// its COMMIT; poll_interval bounds the wait when a notification is lost. A row is sent before
// it is deleted: a relay killed between the two sends it again after a restart, with the same
// message id, so a consumer with an idempotency store (a downstream inbox) handles it once.
// Failures (database down or restarted, broker refusing) end the pass; the relay retries with
// backoff, resending from the oldest row, so order per destination holds.
//
// Thread-safety: Run on one thread at a time; stats() from any thread.

#ifndef TRANSACTIONAL_POSTGRES_OUTBOX_RELAY_H_
#define TRANSACTIONAL_POSTGRES_OUTBOX_RELAY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bus/backoff.h"
#include "bus/driver.h"
#include "bus/logger.h"
#include "bus/transactional.h"
#include "common/postgres/postgres_database.h"

namespace bus {

struct PostgresRelayOptions {
  // Rows read and sent per pass; >= 1. Default 256.
  int batch_size = 256;
  // The longest wait for a notification before looking at the table anyway; > 0. Default 5 s.
  absl::Duration poll_interval = absl::Seconds(5);
  // Waits after a failure (and between tries for the lock another relay holds).
  // Default 100 ms doubling to 5 s, full jitter; 0 <= initial <= max.
  BackoffPolicy backoff{.initial = absl::Milliseconds(100),
                        .max = absl::Seconds(5),
                        .jitter = BackoffPolicy::Jitter::kFull};
};

// InvalidArgument naming the first bad field.
absl::Status ValidatePostgresRelayOptions(const PostgresRelayOptions& options);

class PostgresOutboxRelay final : public BackgroundTask {
 public:
  // `db`, `driver` and `logger` must not be null; `options` must be valid.
  PostgresOutboxRelay(std::shared_ptr<PostgresDatabase> db, std::shared_ptr<Driver> driver,
                      std::shared_ptr<Logger> logger, PostgresRelayOptions options = {});

  std::string name() const override { return "postgres outbox relay"; }
  // Relays until `stop` is requested; returns soon after.
  void Run(std::stop_token stop) override;

  struct Stats {
    // Rows sent to the broker (and deleted) by this relay.
    uint64_t relayed = 0;
    // Passes that failed (database or broker).
    uint64_t relay_errors = 0;
    // Whether this relay holds the lock (it is the active one).
    bool active = false;
  };
  Stats stats() const;

 private:
  // One session: the lock, LISTEN, passes until `stop` or a failure.
  absl::Status Session(std::stop_token stop, int wake_fd, Backoff& backoff);
  // Sends up to `batch` rows; the number sent.
  absl::StatusOr<int> Pass(pg_internal::Connection& conn);

  const std::shared_ptr<PostgresDatabase> db_;
  const std::shared_ptr<Driver> driver_;
  const std::shared_ptr<Logger> logger_;
  const PostgresRelayOptions options_;
  const std::string read_, delete_, lock_sql_, listen_sql_, lock_key_;
  std::atomic<uint64_t> relayed_{0};
  std::atomic<uint64_t> relay_errors_{0};
  std::atomic<bool> active_{false};
};

// What waits in the outbox of `db`: rows not yet sent, and the age of the oldest (zero when
// none). Errors as the database layer's.
struct PostgresOutboxDepth {
  int64_t pending = 0;
  absl::Duration oldest_age = absl::ZeroDuration();
};
absl::StatusOr<PostgresOutboxDepth> PostgresOutboxPending(PostgresDatabase& db);

}  // namespace bus

#endif  // TRANSACTIONAL_POSTGRES_OUTBOX_RELAY_H_
