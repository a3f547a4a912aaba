#include "transactional/postgres/outbox_relay.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"
#include "transactional/postgres/internal/outbox_sql.h"

namespace bus {

using pg_internal::Connection;
using pg_internal::Param;
using pg_internal::Result;
using pg_internal::Statement;

absl::Status ValidatePostgresRelayOptions(const PostgresRelayOptions& options) {
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError("PostgresRelayOptions.batch_size: must be >= 1");
  }
  if (options.poll_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PostgresRelayOptions.poll_interval: must be > 0");
  }
  if (options.backoff.initial < absl::ZeroDuration() ||
      options.backoff.max < options.backoff.initial) {
    return absl::InvalidArgumentError("PostgresRelayOptions.backoff: needs 0 <= initial <= max");
  }
  return absl::OkStatus();
}

PostgresOutboxRelay::PostgresOutboxRelay(std::shared_ptr<PostgresDatabase> db,
                                         std::shared_ptr<Driver> driver,
                                         std::shared_ptr<Logger> logger,
                                         PostgresRelayOptions options)
    : db_(std::move(db)),
      driver_(std::move(driver)),
      logger_(std::move(logger)),
      options_(options),
      read_(db_->Sql(pg_internal::kReadOutboxSql)),
      delete_(db_->Sql(pg_internal::kDeleteOutboxSql)),
      lock_sql_(pg_internal::kRelayLockSql),
      listen_sql_(absl::StrCat("LISTEN ", pg_internal::QuoteIdentifier(
                                              pg_internal::OutboxChannel(db_->options().schema)))),
      lock_key_(absl::StrCat("msgbus.outbox:", db_->options().schema)) {}

PostgresOutboxRelay::Stats PostgresOutboxRelay::stats() const {
  return {relayed_.load(std::memory_order_relaxed), relay_errors_.load(std::memory_order_relaxed),
          active_.load(std::memory_order_relaxed)};
}

void PostgresOutboxRelay::Run(std::stop_token stop) {
  // The session's waits on the server's socket end early when `stop` is requested. The fd is
  // closed after on_stop is gone: ~stop_callback waits for a callback running on the stopping
  // thread, which would otherwise write to a closed (or reused) fd.
  struct WakeFd {
    ~WakeFd() {
      if (fd >= 0) close(fd);
    }
    const int fd;
  } wake_fd{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  const int wake = wake_fd.fd;
  std::stop_callback on_stop(stop, [wake] {
    const uint64_t one = 1;
    (void)!write(wake, &one, sizeof(one));
  });
  Backoff backoff(options_.backoff);
  while (!stop.stop_requested()) {
    const absl::Status st = Session(stop, wake, backoff);
    active_.store(false, std::memory_order_relaxed);
    if (stop.stop_requested()) break;
    relay_errors_.fetch_add(1, std::memory_order_relaxed);
    LogRecord r;
    r.level = LogLevel::kWarning;
    r.time = db_->options().clock->Now();
    r.component = "postgres";
    r.event = "outbox_relay_failed";
    const std::string error = st.ToString();
    r.error = error;
    r.text = "outbox relay: a pass failed; retrying from the oldest row after a backoff";
    logger_->Write(r);
    if (SleepAfterFailure(*db_->options().clock, backoff, stop)) break;
  }
}

absl::Status PostgresOutboxRelay::Session(std::stop_token stop, int wake_fd, Backoff& backoff) {
  absl::StatusOr<std::unique_ptr<Connection>> conn = pg_internal::Engine(*db_).OpenSession();
  if (!conn.ok()) return conn.status();
  Connection& c = **conn;
  // One active relay: the others wait for its session, and its lock, to end.
  const Statement lock{&lock_sql_, {Param::Text(lock_key_)}};
  while (true) {
    absl::StatusOr<std::vector<Result>> r =
        c.Pipeline({&lock, 1}, pg_internal::Engine(*db_).Deadline(1));
    if (!r.ok()) return r.status();
    if ((*r)[0].Bool(0, 0)) break;
    // Real time: another server session holds the lock; try again after a backoff.
    absl::StatusOr<bool> woken = c.AwaitNotification(absl::Now() + backoff.Next(), wake_fd);
    if (!woken.ok()) return woken.status();
    if (stop.stop_requested()) return absl::OkStatus();
  }
  active_.store(true, std::memory_order_relaxed);
  const Statement listen{&listen_sql_};
  if (absl::Status st = c.Pipeline({&listen, 1}, pg_internal::Engine(*db_).Deadline(1)).status();
      !st.ok())
    return st;
  while (!stop.stop_requested()) {
    absl::StatusOr<int> sent = Pass(c);
    if (!sent.ok()) return sent.status();
    backoff.Reset();
    if (*sent >= options_.batch_size) continue;
    // Real time: the wait for a commit's notification, bounded by the slow poll.
    absl::StatusOr<bool> woken = c.AwaitNotification(absl::Now() + options_.poll_interval, wake_fd);
    if (!woken.ok()) return woken.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PostgresOutboxRelay::Pass(Connection& conn) {
  const Statement read{&read_, {Param::Int(options_.batch_size)}};
  absl::StatusOr<std::vector<Result>> r =
      conn.Pipeline({&read, 1}, pg_internal::Engine(*db_).Deadline(1));
  if (!r.ok()) return r.status();
  const Result& rows = (*r)[0];
  const int n = rows.rows();
  const auto destination = [&](int i) { return rows.Bytes(i, 2); };
  const auto delay = [&](int i) { return absl::Microseconds(rows.Int(i, 5)); };
  const auto to_queue_now = [&](int i) {
    return rows.Int(i, 1) == 0 && delay(i) == absl::ZeroDuration();
  };
  // In seq order: runs of rows to one queue with no delay left go out in one batched call
  // (which keeps their order), the others one at a time. The first failure ends the pass.
  std::vector<int64_t> sent;
  absl::Status failure;
  std::vector<std::string> run;
  for (int i = 0; i < n;) {
    int end = i + 1;
    absl::Status s;
    if (rows.Int(i, 1) == 1) {
      s = driver_->SendToTopic(destination(i), rows.Bytes(i, 4), rows.Bytes(i, 3));
    } else if (!to_queue_now(i)) {
      s = driver_->SendToQueue(destination(i), rows.Bytes(i, 4), delay(i));
    } else {
      while (end < n && to_queue_now(end) && destination(end) == destination(i)) ++end;
      if (end == i + 1) {
        s = driver_->SendToQueue(destination(i), rows.Bytes(i, 4), absl::ZeroDuration());
      } else {
        run.clear();
        for (int k = i; k < end; ++k) run.emplace_back(rows.Bytes(k, 4));
        s = driver_->SendBatchToQueue(destination(i), run, absl::ZeroDuration());
      }
    }
    if (!s.ok()) {
      failure = absl::Status(s.code(), absl::StrCat("outbox relay: sending to ", destination(i),
                                                    " failed: ", s.message()));
      break;
    }
    for (int k = i; k < end; ++k) sent.push_back(rows.Int(k, 0));
    i = end;
  }
  if (!sent.empty()) {
    // Sent but not deleted (the database went away): sent again by a later pass, same ids.
    const Statement del{&delete_, {Param::Text(absl::StrCat("{", absl::StrJoin(sent, ","), "}"))}};
    if (absl::Status st = conn.Pipeline({&del, 1}, pg_internal::Engine(*db_).Deadline(1)).status();
        !st.ok())
      return st;
    relayed_.fetch_add(sent.size(), std::memory_order_relaxed);
  }
  if (!failure.ok()) return failure;
  return static_cast<int>(sent.size());
}

absl::StatusOr<PostgresOutboxDepth> PostgresOutboxPending(PostgresDatabase& db) {
  const std::string sql = db.Sql(pg_internal::kCountOutboxSql);
  const Statement s{&sql};
  absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(db).Run({&s, 1});
  if (!r.ok()) return r.status();
  PostgresOutboxDepth d;
  d.pending = (*r)[0].Int(0, 0);
  d.oldest_age = absl::Microseconds(static_cast<int64_t>((*r)[0].Float(0, 1) * 1e6));
  return d;
}

}  // namespace bus
