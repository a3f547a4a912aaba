// The seam for exactly-once effects (docs/exactly-once.md): an idempotency store that can run a
// handler's effect inside the transaction that marks the message's key done (an inbox), the
// transactional handler built on it, and background work such a store needs beside the Handler
// (an outbox relay). bus/ knows nothing of the store behind it; transactional/sqlite/inbox.h is
// the implementation.
//
//   bus::TransactionalHandler effect = inbox->Handle(fn);  // the inbox and fn, paired
//   auto handler = bus::Handler::Create(options, std::move(effect));
//
// A Handler built so runs steps 4 and 5 of the pipeline as one call of
// TransactionalStore::RunAndMarkDone for the messages of a batch: the effect of each message
// and the mark-done of its key commit together, or neither does. The inbox is the Handler's
// idempotency store.
//
// Thread-safety: implementations are safe for concurrent use from multiple threads.

#ifndef BUS_TRANSACTIONAL_H_
#define BUS_TRANSACTIONAL_H_

#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bus/driver.h"
#include "bus/handle_context.h"
#include "bus/logger.h"
#include "bus/message.h"
#include "bus/stores.h"

namespace bus {
namespace internal {
struct Pipeline;  // bus/internal/pipeline.h
}  // namespace internal

// The store's open transaction, as the effect sees it. Each store derives its own type from it
// (SqliteTransaction) and its handle helper casts to that; the pipeline only passes it on. Valid
// only during the effect call.
class Transaction {
 public:
  virtual ~Transaction() = default;

  // The Handler's context for the effect running now (bus/handle_context.h): stopping(), a
  // wait that returns on Stop(). Outside a Handler's effect call, a context that never stops.
  const HandleContext& context() const;

 private:
  friend struct internal::Pipeline;
  // Set by the pipeline around each effect call.
  const HandleContext* context_ = nullptr;
};

// Work that runs beside a Handler for as long as it consumes (an outbox relay): Run is called on
// a thread of its own once the queue is set up and must return soon after `stop` is requested.
// It must not throw.
class BackgroundTask {
 public:
  virtual ~BackgroundTask() = default;
  // For logs ("outbox relay").
  virtual std::string name() const = 0;
  virtual void Run(std::stop_token stop) = 0;
};

// An IdempotencyStore that can also commit effects with mark-done (an inbox).
class TransactionalStore : public IdempotencyStore {
 public:
  struct Entry {
    // The key to mark done with the effect, and its owner; an empty key runs the effect without
    // a mark-done (a message handled without its key, when `ensure` said kNotHandled).
    absl::string_view key{};
    absl::string_view owner{};
  };

  // Runs, in one transaction (which other callers' writes may share), for each entry in order:
  // effect(i, tx); then, when it returned OK, marks entries[i].key done for `retention`, but
  // only if entries[i].owner still holds a live lease on it, checked inside the transaction.
  // When the effect fails or the key is no longer owned, everything entry i did is rolled back
  // and the other entries stand. `effect` is called exactly once per entry, or not at all when
  // the transaction could not be started; it must not throw. results[i], once the transaction
  // has committed or failed:
  //  - OK: the effect and the mark-done are committed;
  //  - the effect's own error: the effect failed and nothing of it stays (the key is still
  //    leased to the owner, for the pipeline to release);
  //  - FailedPrecondition: the owner had lost the lease; the effect was rolled back;
  //  - another error (Unavailable: the database stayed locked for longer than its busy
  //    timeout): nothing of the entry is in the store, the key is still leased.
  // `results` has entries.size() elements.
  virtual void RunAndMarkDone(absl::Span<const Entry> entries, absl::Duration retention,
                              absl::FunctionRef<absl::Status(size_t i, Transaction& tx)> effect,
                              absl::Span<absl::Status> results) = 0;

  // Work the Handler runs beside its consumer, on `driver` (an outbox relay); default none.
  virtual std::vector<std::shared_ptr<BackgroundTask>> BackgroundTasks(
      const std::shared_ptr<Driver>& driver, const std::shared_ptr<Logger>& logger) {
    (void)driver;
    (void)logger;
    return {};
  }
};

// An effect that runs inside the inbox's transaction (the store's Transaction type: its handle
// helper casts to it).
using TransactionalHandleFn = std::function<absl::Status(const Message& msg, Transaction& tx)>;

// A transactional handler for Handler::Create(options, handler): the inbox and the effect that
// runs in its transactions. Build it with the store's helper (SqliteInbox::Handle), which pairs
// an effect with the inbox whose transaction type it expects.
struct TransactionalHandler {
  std::shared_ptr<TransactionalStore> inbox{};
  TransactionalHandleFn handle{};
};

}  // namespace bus

#endif  // BUS_TRANSACTIONAL_H_
