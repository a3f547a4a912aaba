// The Kafka record key of a message: its envelope's biz_uid (the message id when that is empty),
// read from the envelope's header without decoding the rest (docs/wire-format.md), so all
// messages of one business key go to one partition, in order. Empty (no key: Kafka spreads the
// records) when the bytes are not a version 1 envelope.
//
// Thread-safety: a free function.

#ifndef DRIVERS_KAFKA_INTERNAL_RECORD_KEY_H_
#define DRIVERS_KAFKA_INTERNAL_RECORD_KEY_H_

#include "absl/strings/string_view.h"

namespace bus::kafka {

// A view into `envelope`.
absl::string_view RecordKey(absl::string_view envelope);

}  // namespace bus::kafka

#endif  // DRIVERS_KAFKA_INTERNAL_RECORD_KEY_H_
