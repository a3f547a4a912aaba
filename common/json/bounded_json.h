// ParseJsonBounded: nlohmann::json's parser with the nesting depth bounded, for every document the
// library parses from outside the process (an nsqd's or nsqlookupd's answer, a dead letter
// shown by the console, a console request). nlohmann::json keeps each nested array or object
// as a node of its own: a 4 MB answer of 2 million nested arrays costs about 40 times its size
// in memory. Bounding the depth refuses such a document at the first level too deep, before
// it is built.
//
//   absl::StatusOr<nlohmann::json> j = bus::ParseJsonBounded(body);
//   if (!j.ok() || !j->is_object()) return ...;
//
// Thread-safety: a pure function.

#ifndef COMMON_JSON_BOUNDED_JSON_H_
#define COMMON_JSON_BOUNDED_JSON_H_

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bus {

// The default bound: arrays and objects nested at most this deep. The documents the library
// reads nest 4 levels at most (nsqd's /stats: data, topics, channels, clients).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as one JSON document (strict: nothing but whitespace after it) whose arrays and
// objects nest at most `max_depth` levels (>= 1). Never throws. InvalidArgument when `text` is
// not JSON ("not JSON: <parser's message>") or nests deeper ("JSON nested deeper than 64
// levels").
absl::StatusOr<nlohmann::json> ParseJsonBounded(absl::string_view text,
                                                int max_depth = kMaxJsonDepth);

}  // namespace bus

#endif  // COMMON_JSON_BOUNDED_JSON_H_
