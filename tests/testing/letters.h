// A dead letter to store, for tests: DeadLetterStore::Store takes the whole letter.
//
//   ASSERT_TRUE(store->Store(Letter("orders", data, "boom")).ok());

#ifndef TESTS_TESTING_LETTERS_H_
#define TESTS_TESTING_LETTERS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "bus/stores.h"

namespace bus::testing {

inline DeadLetter Letter(absl::string_view queue, absl::string_view data, absl::string_view reason,
                         DeadLetterKind kind = DeadLetterKind::kExhausted) {
  DeadLetter letter;
  letter.queue = std::string(queue);
  letter.data = std::string(data);
  letter.reason = std::string(reason);
  letter.kind = kind;
  return letter;
}

}  // namespace bus::testing

#endif  // TESTS_TESTING_LETTERS_H_
