// An in-memory DeadLetterStore, for tests and for processes that accept losing dead letters on
// restart. Letters are kept per queue in arrival order; ids are decimal sequence numbers.
//
// Thread-safety: safe for concurrent use.

#ifndef STORAGE_MEMORY_MEMORY_DEAD_LETTER_STORE_H_
#define STORAGE_MEMORY_MEMORY_DEAD_LETTER_STORE_H_

#include <memory>

#include "bus/clock.h"
#include "bus/stores.h"

namespace bus {

// `clock` (default RealClock()) stamps DeadLetter::stored_at.
std::shared_ptr<DeadLetterStore> NewMemoryDeadLetterStore(std::shared_ptr<Clock> clock = nullptr);

}  // namespace bus

#endif  // STORAGE_MEMORY_MEMORY_DEAD_LETTER_STORE_H_
