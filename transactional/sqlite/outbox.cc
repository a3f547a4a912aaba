#include "transactional/sqlite/outbox.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bus/backoff.h"
#include "bus/publisher.h"
#include "common/sqlite/internal/database.h"
#include "common/sqlite/internal/outbox_sql.h"

namespace bus {

using sqlite_internal::Connection;
using sqlite_internal::ScopedStatement;

namespace {

struct Row {
  int64_t seq = 0;
  int kind = 0;
  std::string destination;
  std::string route_key;
  int64_t delay_ms = 0;
  std::string data;
  int64_t created_at_us = 0;
};

// What one pass sent: `sent` rows, the last of them `sent_upto` (-1: none), and the failure
// that ended the pass early (OK: every row was sent).
struct SendOutcome {
  int sent = 0;
  int64_t sent_upto = -1;
  absl::Status failure;
};

// The oldest `limit` rows of the outbox, in commit order.
absl::StatusOr<std::vector<Row>> ReadRows(sqlite_internal::Database& db, int limit) {
  std::vector<Row> rows;
  const absl::Status read = db.Read([&](Connection& conn) -> absl::Status {
    absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kFetchOutboxSql);
    if (!stmt.ok()) return stmt.status();
    stmt->BindInt64(1, limit);
    while (true) {
      absl::StatusOr<bool> more = stmt->Step();
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
      Row& r = rows.emplace_back();
      r.seq = stmt->ColumnInt64(0);
      r.kind = static_cast<int>(stmt->ColumnInt64(1));
      r.destination = std::string(stmt->ColumnText(2));
      r.route_key = std::string(stmt->ColumnText(3));
      r.delay_ms = stmt->ColumnInt64(4);
      r.data = std::string(stmt->ColumnBlob(6));
      r.created_at_us = stmt->ColumnInt64(7);
    }
  });
  if (!read.ok()) return read;
  return rows;
}

// Sends `rows` in order: runs of rows to one queue with no delay left go out in one batched
// call (which keeps their order), the others one at a time. The first failure ends the pass.
SendOutcome SendRows(Driver& driver, std::vector<Row>& rows, absl::Time now) {
  auto delay_left = [&](const Row& r) {
    const absl::Time due = absl::FromUnixMicros(r.created_at_us) + absl::Milliseconds(r.delay_ms);
    return std::max(due - now, absl::ZeroDuration());
  };
  SendOutcome out;
  std::vector<std::string> run;
  for (size_t i = 0; i < rows.size();) {
    const Row& r = rows[i];
    size_t end = i + 1;
    absl::Status s;
    if (r.kind == 1) {
      s = driver.SendToTopic(r.destination, r.data, r.route_key);
    } else if (const absl::Duration d = delay_left(r); d > absl::ZeroDuration()) {
      s = driver.SendToQueue(r.destination, r.data, d);
    } else {
      while (end < rows.size() && rows[end].kind == 0 && rows[end].destination == r.destination &&
             delay_left(rows[end]) == absl::ZeroDuration()) {
        ++end;
      }
      if (end == i + 1) {
        s = driver.SendToQueue(r.destination, r.data, absl::ZeroDuration());
      } else {
        run.clear();
        for (size_t k = i; k < end; ++k) run.push_back(std::move(rows[k].data));
        s = driver.SendBatchToQueue(r.destination, run, absl::ZeroDuration());
      }
    }
    if (!s.ok()) {
      out.failure = absl::Status(s.code(), absl::StrCat("outbox relay: sending to ", r.destination,
                                                        " failed: ", s.message()));
      return out;
    }
    out.sent += static_cast<int>(end - i);
    out.sent_upto = rows[end - 1].seq;
    i = end;
  }
  return out;
}

class RelayTaskImpl final : public BackgroundTask {
 public:
  RelayTaskImpl(std::shared_ptr<SqliteOutbox> outbox, std::shared_ptr<Driver> driver,
                std::shared_ptr<Logger> logger)
      : outbox_(std::move(outbox)), driver_(std::move(driver)), logger_(std::move(logger)) {}
  std::string name() const override { return "outbox relay"; }
  void Run(std::stop_token stop) override { outbox_->RunRelay(*driver_, *logger_, stop); }

 private:
  std::shared_ptr<SqliteOutbox> outbox_;
  std::shared_ptr<Driver> driver_;
  std::shared_ptr<Logger> logger_;
};

}  // namespace

absl::Status ValidateSqliteOutboxOptions(const SqliteOutboxOptions& o) {
  auto bad = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("SqliteOutboxOptions.", field, " ", what));
  };
  if (o.relay_batch_size < 1) return bad("relay_batch_size", "must be >= 1");
  if (o.poll_interval <= absl::ZeroDuration()) return bad("poll_interval", "must be > 0");
  if (o.backoff.initial <= absl::ZeroDuration()) return bad("backoff.initial", "must be > 0");
  if (o.backoff.max < o.backoff.initial) return bad("backoff.max", "must be >= backoff.initial");
  if (o.relay_lease <= absl::ZeroDuration()) return bad("relay_lease", "must be > 0");
  if (o.max_message_bytes < 64) return bad("max_message_bytes", "must be >= 64");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SqliteOutbox>> SqliteOutbox::Create(
    std::shared_ptr<SqliteDatabase> db, SqliteOutboxOptions options) {
  if (db == nullptr) return absl::InvalidArgumentError("SqliteOutbox::Create: null database");
  if (absl::Status s = ValidateSqliteOutboxOptions(options); !s.ok()) return s;
  return std::shared_ptr<SqliteOutbox>(new SqliteOutbox(std::move(db), std::move(options)));
}

SqliteOutbox::SqliteOutbox(std::shared_ptr<SqliteDatabase> db, SqliteOutboxOptions options)
    : db_(std::move(db)), options_(std::move(options)), owner_(NewMessageId()) {}

absl::Status SqliteOutbox::Transact(absl::FunctionRef<absl::Status(SqliteTransaction&)> fn) {
  int runs = 0;
  absl::Status result;
  int published = 0;
  const absl::Status s = sqlite_internal::Engine(db_)->Write([&](Connection& conn) -> absl::Status {
    // The database layer may run an operation again (docs/exactly-once.md, "Decisions"); the
    // application's function runs once, so a second run commits nothing.
    if (++runs > 1) {
      return absl::AbortedError("outbox transaction retried by the database layer; not rerun");
    }
    SqliteTransaction tx(conn, *sqlite_internal::Engine(db_)->clock(), options_.max_message_bytes);
    absl::Status lost = sqlite_internal::RunInSavepoint(
        conn,
        [&]() -> absl::Status {
          try {
            return fn(tx);
          } catch (const std::exception& e) {
            return absl::UnknownError(absl::StrCat("outbox transaction threw: ", e.what()));
          } catch (...) {
            return absl::UnknownError("outbox transaction threw a non-std exception");
          }
        },
        &result);
    published = tx.published();
    return lost;
  });
  if (s.ok() && result.ok()) {
    Committed(1, static_cast<uint64_t>(published));
    return absl::OkStatus();
  }
  RolledBack(1);
  return s.ok() ? result : s;
}

void SqliteOutbox::Committed(uint64_t transactions, uint64_t published) {
  committed_.fetch_add(transactions, std::memory_order_relaxed);
  if (published == 0) return;
  published_.fetch_add(published, std::memory_order_relaxed);
  absl::MutexLock lock(&wake_mu_);
  wake_ = true;
}

void SqliteOutbox::RolledBack(uint64_t transactions) {
  rolled_back_.fetch_add(transactions, std::memory_order_relaxed);
}

absl::StatusOr<bool> SqliteOutbox::HoldLease() {
  const absl::Time now = sqlite_internal::Engine(db_)->clock()->Now();
  if (now + options_.relay_lease / 2 < lease_until_) return true;
  const absl::Time until = now + options_.relay_lease;
  bool held = false;
  const absl::Status s = sqlite_internal::Engine(db_)->Write([&](Connection& conn) -> absl::Status {
    absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kTakeRelayLeaseSql);
    if (!stmt.ok()) return stmt.status();
    stmt->BindText(1, owner_);
    stmt->BindInt64(2, absl::ToUnixMillis(until));
    stmt->BindInt64(3, absl::ToUnixMillis(now));
    if (absl::Status run = stmt->Run(); !run.ok()) return run;
    held = conn.Changes() == 1;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  lease_until_ = held ? until : absl::InfinitePast();
  return held;
}

absl::StatusOr<int> SqliteOutbox::RelayOnce(Driver& driver) {
  absl::MutexLock lock(&relay_mu_);
  absl::StatusOr<bool> held = HoldLease();
  if (!held.ok()) return held.status();
  if (!*held) return 0;
  absl::StatusOr<std::vector<Row>> rows =
      ReadRows(*sqlite_internal::Engine(db_), options_.relay_batch_size);
  if (!rows.ok()) {
    relay_errors_.fetch_add(1, std::memory_order_relaxed);
    return rows.status();
  }
  if (rows->empty()) return 0;
  const SendOutcome out = SendRows(driver, *rows, sqlite_internal::Engine(db_)->clock()->Now());
  if (out.sent_upto >= 0) {
    const absl::Status del =
        sqlite_internal::Engine(db_)->Write([&](Connection& conn) -> absl::Status {
          absl::StatusOr<ScopedStatement> stmt =
              conn.Prepare(sqlite_internal::kDeleteOutboxUpToSql);
          if (!stmt.ok()) return stmt.status();
          stmt->BindInt64(1, out.sent_upto);
          return stmt->Run();
        });
    if (!del.ok()) {
      // Sent but still in the outbox: sent again by the next pass (same ids).
      relay_errors_.fetch_add(1, std::memory_order_relaxed);
      return absl::Status(del.code(),
                          absl::StrCat("outbox relay: deleting sent rows failed (they will be "
                                       "sent again): ",
                                       del.message()));
    }
    relayed_.fetch_add(static_cast<uint64_t>(out.sent), std::memory_order_relaxed);
  }
  if (!out.failure.ok()) {
    relay_errors_.fetch_add(1, std::memory_order_relaxed);
    return out.failure;
  }
  return out.sent;
}

void SqliteOutbox::RunRelay(Driver& driver, Logger& logger, std::stop_token stop) {
  auto log = [&](LogLevel level, absl::string_view event, absl::string_view text,
                 absl::string_view error) {
    LogRecord r;
    r.level = level;
    r.component = "outbox";
    r.event = event;
    r.text = text;
    r.error = error;
    try {
      r.time = sqlite_internal::Engine(db_)->clock()->Now();
      logger.Write(r);
    } catch (...) {
    }
  };
  {
    absl::MutexLock lock(&wake_mu_);
    stopping_ = false;
    wake_ = true;  // rows a crash left behind go out at once
  }
  std::stop_callback on_stop(stop, [this] {
    absl::MutexLock lock(&wake_mu_);
    stopping_ = true;
  });
  const Clock& clock = *sqlite_internal::Engine(db_)->clock();
  Backoff backoff(options_.backoff, options_.random);
  while (!stop.stop_requested()) {
    {
      absl::MutexLock lock(&wake_mu_);
      wake_ = false;
    }
    absl::StatusOr<int> sent = RelayOnce(driver);
    if (!sent.ok()) {
      if (backoff.failures() == 0) {
        const std::string error = sent.status().ToString();
        log(LogLevel::kError, "relay_failed",
            absl::StrCat("outbox relay: ", error,
                         "; retrying with backoff until the broker accepts"),
            error);
      }
      // A backoff is not cut short by new commits: the broker is the problem.
      SleepAfterFailure(clock, backoff, stop);
      continue;
    }
    if (backoff.failures() > 0) {
      log(LogLevel::kInfo, "relay_recovered", "outbox relay: the broker accepts again", {});
    }
    backoff.Reset();
    if (*sent == options_.relay_batch_size) continue;  // more rows are likely waiting
    absl::MutexLock lock(&wake_mu_);
    clock.AwaitWithDeadline(&wake_mu_, absl::Condition(this, &SqliteOutbox::Woken),
                            clock.Now() + options_.poll_interval);
  }
  // A clean stop gives the lease up, so another process's relay need not wait for it.
  absl::MutexLock lock(&relay_mu_);
  if (lease_until_ != absl::InfinitePast()) {
    sqlite_internal::Engine(db_)
        ->Write([&](Connection& conn) -> absl::Status {
          absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kDropRelayLeaseSql);
          if (!stmt.ok()) return stmt.status();
          stmt->BindText(1, owner_);
          return stmt->Run();
        })
        .IgnoreError();
    lease_until_ = absl::InfinitePast();
  }
}

std::shared_ptr<BackgroundTask> SqliteOutbox::RelayTask(std::shared_ptr<Driver> driver,
                                                        std::shared_ptr<Logger> logger) {
  if (logger == nullptr) logger = DefaultLogger();
  return std::make_shared<RelayTaskImpl>(shared_from_this(), std::move(driver), std::move(logger));
}

std::unique_ptr<SqliteOutbox::Relay> SqliteOutbox::StartRelay(std::shared_ptr<Driver> driver,
                                                              std::shared_ptr<Logger> logger) {
  std::unique_ptr<Relay> relay(new Relay());
  std::shared_ptr<BackgroundTask> task = RelayTask(std::move(driver), std::move(logger));
  relay->thread_ = std::thread([task, stop = relay->stop_.get_token()] { task->Run(stop); });
  return relay;
}

absl::StatusOr<int64_t> SqliteOutbox::Pending() {
  int64_t n = 0;
  const absl::Status s = sqlite_internal::Engine(db_)->Read([&](Connection& conn) -> absl::Status {
    absl::StatusOr<ScopedStatement> stmt = conn.Prepare(sqlite_internal::kCountOutboxSql);
    if (!stmt.ok()) return stmt.status();
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    n = *row ? stmt->ColumnInt64(0) : 0;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return n;
}

SqliteOutbox::Stats SqliteOutbox::stats() {
  Stats s;
  s.committed = committed_.load(std::memory_order_relaxed);
  s.rolled_back = rolled_back_.load(std::memory_order_relaxed);
  s.published = published_.load(std::memory_order_relaxed);
  s.relayed = relayed_.load(std::memory_order_relaxed);
  s.relay_errors = relay_errors_.load(std::memory_order_relaxed);
  absl::StatusOr<int64_t> pending = Pending();
  s.pending = pending.ok() ? *pending : -1;
  return s;
}

}  // namespace bus
