#include "drivers/postgres/internal/consumer.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bus/intake.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"

namespace bus::pg_internal {
namespace {

// The shortest wait before looking again when the queue's earliest row is due already but was
// not taken: it is being reserved by another consumer (SKIP LOCKED passed it over).
constexpr absl::Duration kMinWait = absl::Milliseconds(5);
// Settles sent in one statement at most.
constexpr size_t kSettleBatch = 1000;

struct ParsedReceipt {
  int64_t id = 0;
  int64_t owner = 0;
};

// A receipt is "<row id>:<lease owner>".
absl::StatusOr<ParsedReceipt> ParseReceipt(absl::string_view receipt) {
  const size_t colon = receipt.find(':');
  ParsedReceipt p;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(receipt.substr(0, colon), &p.id) ||
      !absl::SimpleAtoi(receipt.substr(colon + 1), &p.owner)) {
    return absl::InvalidArgumentError(
        absl::StrCat("postgres: not a receipt of this driver: '", receipt, "'"));
  }
  return p;
}

absl::Status LeaseLost(absl::string_view receipt) {
  return absl::FailedPreconditionError(
      absl::StrCat("postgres: the lease of delivery ", receipt,
                   " was lost (it ran out and the message may be delivered again)"));
}

// Two PostgreSQL bigint[] literals: the ids and the owners of `receipts`.
std::pair<std::string, std::string> Arrays(const std::vector<ParsedReceipt>& receipts) {
  std::vector<int64_t> ids, owners;
  for (const ParsedReceipt& r : receipts) {
    ids.push_back(r.id);
    owners.push_back(r.owner);
  }
  return {absl::StrCat("{", absl::StrJoin(ids, ","), "}"),
          absl::StrCat("{", absl::StrJoin(owners, ","), "}")};
}

class PostgresConsumer final : public Consumer {
 public:
  PostgresConsumer(std::shared_ptr<QueueCore> core, std::string queue, ConsumerOptions options,
                   int wake_fd)
      : core_(std::move(core)),
        queue_(std::move(queue)),
        options_(options),
        wake_fd_(wake_fd),
        intake_(options.max_in_flight) {}

  ~PostgresConsumer() override {
    GiveBack();
    if (session_ != nullptr) core_->sessions.fetch_sub(1, std::memory_order_relaxed);
    close(wake_fd_);
  }

  absl::Status Receive(int max, absl::Duration wait, std::stop_token stop,
                       std::vector<Delivery>* out) override {
    if (max < 1) return absl::InvalidArgumentError("Receive: max must be >= 1");
    const Clock& clock = *core_->db->options().clock;
    const absl::Time deadline = clock.Now() + wait;
    absl::MutexLock receive_lock(&receive_mu_);
    std::stop_callback wake(stop, [this] {
      intake_.Stop();
      // An eventfd's counter only fails to take 1 when it is at its maximum: readable anyway.
      const uint64_t one = 1;
      [[maybe_unused]] const ssize_t written = write(wake_fd_, &one, sizeof(one));
    });
    while (!stop.stop_requested()) {
      const int room =
          intake_.AwaitRoom(clock, max, core_->options.reserve_batch_size, deadline, stop);
      if (room < 0) return absl::OkStatus();
      if (room == 0) continue;
      if (absl::Status st = EnsureSession(); !st.ok()) return st;
      int64_t next_us = -1;
      const size_t before = out->size();
      if (absl::Status st = Reserve(room, out, &next_us); !st.ok()) return st;
      if (out->size() > before) return absl::OkStatus();
      const absl::Duration left = deadline - clock.Now();
      if (left <= absl::ZeroDuration()) return absl::OkStatus();
      absl::Duration block = std::min(left, core_->options.fallback_poll);
      if (next_us >= 0) block = std::min(block, std::max(absl::Microseconds(next_us), kMinWait));
      if (absl::Status st = AwaitNotification(block); !st.ok()) {
        return stop.stop_requested() ? absl::OkStatus() : st;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Ack(absl::string_view receipt) override {
    absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipt);
    Forget({&receipt, 1});
    if (!p.ok()) return p.status();
    absl::StatusOr<std::vector<Result>> r =
        pg_internal::Engine(*core_->db)
            .Run({{&core_->sql.ack, {Param::Int(p->id), Param::Int(p->owner)}, false, true}});
    if (!r.ok()) return r.status();
    return (*r)[0].affected() == 1 ? absl::OkStatus() : LeaseLost(receipt);
  }

  void AckMany(absl::Span<const absl::string_view> receipts,
               absl::Span<absl::Status> results) override {
    Forget(receipts);
    for (size_t start = 0; start < receipts.size(); start += kSettleBatch) {
      const size_t end = std::min(receipts.size(), start + kSettleBatch);
      std::vector<ParsedReceipt> parsed;
      std::vector<size_t> at;
      for (size_t i = start; i < end; ++i) {
        absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipts[i]);
        if (!p.ok()) {
          results[i] = p.status();
          continue;
        }
        parsed.push_back(*p);
        at.push_back(i);
      }
      if (parsed.empty()) continue;
      auto [ids, owners] = Arrays(parsed);
      absl::StatusOr<std::vector<Result>> r =
          pg_internal::Engine(*core_->db)
              .Run({{&core_->sql.ack_many, {Param::Text(ids), Param::Text(owners)}, false, true}});
      absl::flat_hash_set<int64_t> deleted;
      if (r.ok()) {
        for (int row = 0; row < (*r)[0].rows(); ++row) deleted.insert((*r)[0].Int(row, 0));
      }
      for (size_t k = 0; k < parsed.size(); ++k) {
        const size_t i = at[k];
        if (!r.ok()) {
          results[i] = r.status();
        } else {
          results[i] = deleted.contains(parsed[k].id) ? absl::OkStatus() : LeaseLost(receipts[i]);
        }
      }
    }
  }

  absl::Status Nack(absl::string_view receipt, absl::Duration delay) override {
    absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipt);
    Forget({&receipt, 1});
    if (!p.ok()) return p.status();
    absl::StatusOr<int64_t> n = GiveBackRows({*p}, std::max(delay, absl::ZeroDuration()));
    if (!n.ok()) return n.status();
    return *n == 1 ? absl::OkStatus() : LeaseLost(receipt);
  }

  absl::Status Extend(absl::string_view receipt) override {
    absl::StatusOr<ParsedReceipt> p = ParseReceipt(receipt);
    if (!p.ok()) return p.status();
    absl::StatusOr<std::vector<Result>> r =
        pg_internal::Engine(*core_->db)
            .Run({{&core_->sql.extend,
                   {Param::Int(p->id), Param::Int(p->owner),
                    Param::Int(absl::ToInt64Microseconds(options_.lease))},
                   false,
                   true}});
    if (!r.ok()) return r.status();
    return (*r)[0].affected() == 1 ? absl::OkStatus() : LeaseLost(receipt);
  }

  void SetIntake(int max_held) override { intake_.SetLimit(max_held); }

 private:
  // The session that LISTENs on the queue's channel, opened (again) when there is none or it
  // broke. LISTEN runs before the first reserve, so no send that commits after a reserve
  // found the queue empty goes unnoticed.
  absl::Status EnsureSession() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_) {
    if (session_ != nullptr && !session_->broken()) return absl::OkStatus();
    if (session_ != nullptr) {
      session_.reset();
      core_->sessions.fetch_sub(1, std::memory_order_relaxed);
    }
    absl::StatusOr<std::unique_ptr<Connection>> s = pg_internal::Engine(*core_->db).OpenSession();
    if (!s.ok()) return s.status();
    const Statement channel{&core_->sql.channel,
                            {Param::Text(core_->db->options().schema), Param::Text(queue_)}};
    absl::StatusOr<std::vector<Result>> c =
        (*s)->Pipeline({&channel, 1}, pg_internal::Engine(*core_->db).Deadline(1));
    if (!c.ok()) return c.status();
    const std::string listen = absl::StrCat("LISTEN ", QuoteIdentifier((*c)[0].Bytes(0, 0)));
    const Statement listen_stmt{&listen};
    if (absl::StatusOr<std::vector<Result>> l =
            (*s)->Pipeline({&listen_stmt, 1}, pg_internal::Engine(*core_->db).Deadline(1));
        !l.ok()) {
      return l.status();
    }
    session_ = *std::move(s);
    core_->sessions.fetch_add(1, std::memory_order_relaxed);
    if (opened_) core_->reconnects.fetch_add(1, std::memory_order_relaxed);
    opened_ = true;
    return absl::OkStatus();
  }

  // One reserve of up to `room` messages, in one round trip with the query of the queue's next
  // due time (`*next_us`, -1 when the queue is empty).
  absl::Status Reserve(int room, std::vector<Delivery>* out, int64_t* next_us)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_) {
    int64_t owner = 0;
    while (owner == 0) owner = static_cast<int64_t>(absl::Uniform<uint64_t>(random_) >> 1);
    const std::vector<Statement> statements = {
        {&core_->sql.reserve,
         {Param::Text(queue_), Param::Int(room), Param::Int(owner),
          Param::Int(absl::ToInt64Microseconds(options_.lease))},
         false,
         true},
        {&core_->sql.next_due, {Param::Text(queue_)}, false, true},
    };
    absl::StatusOr<std::vector<Result>> r =
        session_->Pipeline(statements, pg_internal::Engine(*core_->db).Deadline(statements.size()));
    if (!r.ok()) return r.status();
    const Result& rows = (*r)[0];
    struct Row {
      int64_t id;
      int attempts;
      std::string data;
    };
    std::vector<Row> got;
    for (int i = 0; i < rows.rows(); ++i) {
      got.push_back(
          {rows.Int(i, 0), static_cast<int>(rows.Int(i, 2)), std::string(rows.Bytes(i, 1))});
    }
    // RETURNING has no order: hand them out oldest first.
    std::sort(got.begin(), got.end(), [](const Row& a, const Row& b) { return a.id < b.id; });
    for (Row& row : got) {
      Delivery d;
      d.receipt = absl::StrCat(row.id, ":", owner);
      d.attempts = row.attempts;
      d.data = std::move(row.data);
      intake_.Hold(d.receipt);
      out->push_back(std::move(d));
    }
    const Result& next = (*r)[1];
    *next_us = next.rows() == 1 && !next.IsNull(0, 0) ? next.Int(0, 0) : -1;
    return absl::OkStatus();
  }

  // Waits up to `block` for a notification on the session or a stop.
  absl::Status AwaitNotification(absl::Duration block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_) {
    core_->waiting.fetch_add(1, std::memory_order_acq_rel);
    // Real time: the wait is on the server's socket.
    absl::StatusOr<bool> r = session_->AwaitNotification(absl::Now() + block, wake_fd_);
    core_->waiting.fetch_sub(1, std::memory_order_acq_rel);
    uint64_t drained;
    while (read(wake_fd_, &drained, sizeof(drained)) > 0) {
    }
    return r.status();
  }

  // Stops counting `receipts` as held (whatever their settle's outcome).
  void Forget(absl::Span<const absl::string_view> receipts) { intake_.Release(receipts); }

  // Gives `receipts` back, due after `delay`; the rows that came back.
  absl::StatusOr<int64_t> GiveBackRows(const std::vector<ParsedReceipt>& receipts,
                                       absl::Duration delay) {
    auto [ids, owners] = Arrays(receipts);
    absl::StatusOr<std::vector<Result>> r =
        pg_internal::Engine(*core_->db)
            .Run({{&core_->sql.nack,
                   {Param::Text(ids), Param::Text(owners),
                    Param::Int(absl::ToInt64Microseconds(delay)),
                    Param::Text(core_->db->options().schema)},
                   false,
                   true}});
    if (!r.ok()) return r.status();
    int64_t n = 0;
    for (int row = 0; row < (*r)[0].rows(); ++row) n += (*r)[0].Int(row, 0);
    return n;
  }

  // On close: what this consumer still holds is ready again at once (best effort: what is not
  // given back comes back when its lease runs out).
  void GiveBack() {
    std::vector<ParsedReceipt> held;
    for (const std::string& r : intake_.TakeAll()) {
      if (absl::StatusOr<ParsedReceipt> p = ParseReceipt(r); p.ok()) held.push_back(*p);
    }
    for (size_t start = 0; start < held.size(); start += kSettleBatch) {
      const size_t end = std::min(held.size(), start + kSettleBatch);
      GiveBackRows({held.begin() + static_cast<ptrdiff_t>(start),
                    held.begin() + static_cast<ptrdiff_t>(end)},
                   absl::ZeroDuration())
          .IgnoreError();
    }
  }

  const std::shared_ptr<QueueCore> core_;
  const std::string queue_;
  const ConsumerOptions options_;
  // An eventfd: written by a stop request to end the wait on the session.
  const int wake_fd_;

  absl::Mutex receive_mu_;  // one Receive at a time (one session)
  std::unique_ptr<Connection> session_ ABSL_GUARDED_BY(receive_mu_);
  // Whether a session was opened before (a new one then counts as a reconnect).
  bool opened_ ABSL_GUARDED_BY(receive_mu_) = false;
  absl::BitGen random_ ABSL_GUARDED_BY(receive_mu_);

  // The deliveries held, bounded by SetIntake (ConsumerOptions::max_in_flight at first).
  IntakeLimiter intake_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Consumer>> NewQueueConsumer(std::shared_ptr<QueueCore> core,
                                                           std::string queue,
                                                           const ConsumerOptions& options) {
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("postgres: consumer of ", queue, ": eventfd: ", std::strerror(errno)));
  }
  return std::make_unique<PostgresConsumer>(std::move(core), std::move(queue), options, fd);
}

}  // namespace bus::pg_internal
