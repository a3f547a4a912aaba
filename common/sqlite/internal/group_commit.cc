// Group commit (as in LevelDB's write path): Write() queues the caller; the one that finds no
// leader runs the queued operations in one transaction and hands the lead on. Read() borrows
// the writer connection when no write is queued.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "absl/container/inlined_vector.h"
#include "common/sqlite/internal/database.h"
#include "common/sqlite/internal/schema.h"

namespace bus::sqlite_internal {
namespace {

// How often a leader yields the CPU in a batch, at most, to let finished callers queue up again.
constexpr int kMaxYields = 4;

}  // namespace

struct Database::Writer {
  explicit Writer(absl::FunctionRef<absl::Status(Connection&)> op) : op(op) {}

  // Blocks until a leader has set `state` to kDone or kLead, and returns it: first checking
  // and yielding the CPU for up to `spin`, then asleep.
  uint32_t Wait(absl::Duration spin) {
    uint32_t s = state.load(std::memory_order_acquire);
    if (s == kWaiting && spin > absl::ZeroDuration()) {
      // A monotonic clock: a wall-clock step back must not stretch the spin.
      const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
      do {
        std::this_thread::yield();
        s = state.load(std::memory_order_acquire);
      } while (s == kWaiting && std::chrono::steady_clock::now() < deadline);
    }
    while (s == kWaiting) {
      state.wait(kWaiting, std::memory_order_acquire);
      s = state.load(std::memory_order_acquire);
    }
    return s;
  }
  // Hands `s` (kDone or kLead) to the waiting caller. The caller may return, and this Writer
  // (on its stack) end, as soon as the store is visible: for a 4-byte atomic, libstdc++'s
  // notify_one only passes the address to the kernel as a wake-up key (a futex) and never reads
  // the object, so a late notify is at worst a spurious wake-up for whoever waits there next,
  // which every wait loop tolerates.
  void Publish(uint32_t s) {
    state.store(s, std::memory_order_release);
    state.notify_one();
  }

  static constexpr uint32_t kWaiting = 0;
  // A leader ran this operation: `status` is its result.
  static constexpr uint32_t kDone = 1;
  // This caller is to lead the next batch.
  static constexpr uint32_t kLead = 2;

  absl::FunctionRef<absl::Status(Connection&)> op;
  absl::Status status;
  std::atomic<uint32_t> state{kWaiting};
};

absl::Status Database::Write(absl::FunctionRef<absl::Status(Connection&)> op) {
  Writer w(op);
  bool lead;
  {
    absl::MutexLock lock(&mu_);
    writers_.push_back(&w);
    ++stats_.operations;
    lead = !leading_;
    leading_ = true;
  }
  if (!lead && w.Wait(options_.spin_wait) == Writer::kDone) {
    finished_not_returned_.fetch_sub(1, std::memory_order_relaxed);
    return w.status;
  }
  // This caller leads: it runs its own operation and those queued behind it, and those that
  // queue while it runs them (see RunBatch).
  MaybeHousekeep();
  MaybeFinishCheckpoint();
  LeadBatch();
  // batch_ belongs to whoever leads next as soon as mu_ is released (a caller arriving while
  // no one leads leads at once), so the writers to wake are copied out under mu_.
  absl::InlinedVector<Writer*, 16> finished;
  Writer* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.transactions;
    for (Writer* x : batch_) {
      writers_.pop_front();
      if (x != &w) finished.push_back(x);
    }
    if (writers_.empty()) {
      leading_ = false;
    } else {
      next = writers_.front();
    }
  }
  // Outside mu_: a woken caller returns at once, without contending for it. A finished writer
  // may be destroyed as soon as it sees its state, so nothing touches it afterwards. The next
  // leader goes first: it is on the critical path.
  if (next != nullptr) next->Publish(Writer::kLead);
  finished_not_returned_.fetch_add(static_cast<int>(finished.size()), std::memory_order_relaxed);
  for (Writer* x : finished) x->Publish(Writer::kDone);
  return w.status;
}

void Database::LeadBatch() {
  Connection& conn = *writer_conn_;
  // Taking the lock first also gives callers that arrive meanwhile a chance to join the batch.
  const absl::Status begin = conn.Exec(kBeginSql);
  batch_.clear();
  TakeQueued();
  if (!begin.ok()) {
    // Typically the lock stayed busy for busy_timeout: the same answer for everyone in line.
    if (conn.InTransaction()) conn.Exec(kRollbackSql).IgnoreError();
    for (Writer* w : batch_) w->status = begin;
    return;
  }
  RunBatch();
}

size_t Database::TakeQueued() {
  const size_t before = batch_.size();
  absl::MutexLock lock(&mu_);
  // writers_ starts with batch_, in order: only the leader removes writers, after its batch.
  for (size_t i = before; i < writers_.size(); ++i) {
    if (static_cast<int>(batch_.size()) == options_.commit_batch_size) break;
    batch_.push_back(writers_[i]);
  }
  return batch_.size() - before;
}

absl::Status Database::RunAlone(absl::FunctionRef<absl::Status(Connection&)> op) {
  Connection& conn = *writer_conn_;
  absl::Status s = conn.Exec(kBeginSql);
  if (s.ok()) s = op(conn);
  if (s.ok()) s = conn.Exec(kCommitSql);
  if (!s.ok() && conn.InTransaction()) conn.Exec(kRollbackSql).IgnoreError();
  return s;
}

void Database::RunBatch() {
  Connection& conn = *writer_conn_;
  if (batch_.size() == 1 && finished_not_returned_.load(std::memory_order_relaxed) == 0) {
    // A lone caller, alone in its transaction: an error rolls the transaction back.
    Writer& w = *batch_[0];
    w.status = w.op(conn);
    if (w.status.ok()) w.status = conn.Exec(kCommitSql);
    if (!w.status.ok() && conn.InTransaction()) {
      conn.Exec(kRollbackSql).IgnoreError();
    }
    return;
  }
  // The operations run one after another in the open transaction, without savepoints: a
  // statement that fails is undone by SQLite itself (statement rollback), so an operation that
  // fails without a completed change leaves nothing behind, and the others stand. SQLite counts
  // the rows changed by every completed INSERT, UPDATE and DELETE (and only those), so an
  // operation that failed after a change of its own shows as a change in the count: then the
  // batch is run again with a savepoint per operation, which can undo exactly that operation.
  //
  // Callers that queue while the batch runs join it, up to commit_batch_size. Those that the
  // previous batch has just finished are likely to write again at once; when they wait for a CPU
  // (more threads than cores), yielding (at most kMaxYields times) lets them queue up and join this
  // transaction instead of the next, which they would otherwise have to themselves. The leader
  // runs the operations it has meanwhile, so their return overlaps with its work.
  bool intact = true;
  bool undo_needed = false;
  size_t ran = 0;
  int yields = 0;
  while (true) {
    if (ran == batch_.size() && TakeQueued() == 0) {
      if (yields == kMaxYields || static_cast<int>(batch_.size()) == options_.commit_batch_size ||
          finished_not_returned_.load(std::memory_order_relaxed) == 0) {
        break;
      }
      ++yields;
      std::this_thread::yield();
      continue;
    }
    Writer* w = batch_[ran++];
    const int64_t changes_before = conn.TotalChanges();
    w->status = w->op(conn);
    if (!conn.InTransaction()) {
      intact = false;
      break;
    }
    if (!w->status.ok() && conn.TotalChanges() != changes_before) {
      undo_needed = true;
      break;
    }
  }
  if (undo_needed) {
    intact = conn.Exec(kRollbackSql).ok() && conn.Exec(kBeginSql).ok() && RunBatchWithSavepoints();
  }
  if (intact && conn.Exec(kCommitSql).ok()) return;
  // SQLite rolled the whole transaction back on its own (disk full, I/O error) or COMMIT failed:
  // nothing of this batch is in the file. Run each operation in a transaction of its own, so
  // that each caller gets the result of its own operation and no other.
  if (conn.InTransaction()) conn.Exec(kRollbackSql).IgnoreError();
  for (Writer* w : batch_) w->status = RunAlone(w->op);
}

bool Database::RunBatchWithSavepoints() {
  Connection& conn = *writer_conn_;
  for (Writer* w : batch_) {
    absl::Status s = conn.Exec(kSavepointSql);
    if (s.ok()) {
      w->status = w->op(conn);
      if (w->status.ok()) {
        s = conn.Exec(kReleaseSql);
      } else if (conn.InTransaction()) {
        // Undo only this operation's changes; the others in the batch stand.
        s = conn.Exec(kRollbackToSql);
        if (s.ok()) s = conn.Exec(kReleaseSql);
      }
    }
    if (!s.ok() || !conn.InTransaction()) return false;
  }
  return true;
}

absl::Status Database::Read(absl::FunctionRef<absl::Status(Connection&)> op) {
  // When no write is queued, read on the writer connection, whose page cache is warm (a read
  // connection must re-read every page the writer changed since its last read). Holding the
  // lead meanwhile keeps writers off the connection; the read runs outside any transaction and
  // never joins a write batch, so it sees committed data only.
  bool idle_writer = false;
  {
    absl::MutexLock lock(&mu_);
    if (!leading_) {
      leading_ = true;
      idle_writer = true;
    }
  }
  if (idle_writer) {
    const absl::Status s = op(*writer_conn_);
    Writer* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (writers_.empty()) {
        leading_ = false;
      } else {
        next = writers_.front();
      }
    }
    if (next != nullptr) next->Publish(Writer::kLead);
    return s;
  }
  return RunOnReader(op);
}

}  // namespace bus::sqlite_internal
