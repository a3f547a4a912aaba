// The console's helpers (admin/console.cc): JSON answers, request targets and parameters, and
// dead letters as the API shows them (a letter decoded, searched, summarised, in detail).
// Private to //admin.
//
// Thread-safety: free functions without shared state.

#ifndef ADMIN_INTERNAL_CONSOLE_JSON_H_
#define ADMIN_INTERNAL_CONSOLE_JSON_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "admin/console.h"
#include "bus/message.h"
#include "bus/stores.h"
#include "nlohmann/json.hpp"

namespace bus::console_internal {

using json = nlohmann::json;

// Every answer of the console: scripts and styles from this origin only, nothing inline, no
// other origin for anything (connect, images, frames, forms).
inline constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
// Bounds of a request's parameters; larger values are refused (400), not clamped, so a caller
// learns the limit.
inline constexpr int kDefaultPageLimit = 50;
inline constexpr int kMaxPageLimit = 500;
inline constexpr int kMaxPoints = 1000;
// Letters examined by one list request with a filter; the answer's next_page_token goes on.
inline constexpr int kMaxScanPerRequest = 5000;
// Letters examined to resolve a filtered replay or to find one letter without a hint.
inline constexpr int kMaxScanForIds = 20000;
inline constexpr int kFetchBatch = 200;
// Of a letter's payload: the hex shown, the preview in a list, a reason in a list.
inline constexpr size_t kMaxHexBytes = 64 * 1024;
inline constexpr size_t kPreviewBytes = 160;
inline constexpr size_t kListReasonBytes = 300;
inline constexpr char kPageTokenPrefix[] = "dl1:";

// j as text; invalid UTF-8 from a message is replaced (U+FFFD), never sent raw, never thrown.
std::string Dump(const json& j);
// An answer with `body`; an answer {"error": message}; the answer for a store's error
// (InvalidArgument 400, NotFound 404, FailedPrecondition 409, Unavailable and DeadlineExceeded
// 503, else 502).
ConsoleResponse Json(int status, const json& body);
ConsoleResponse Error(int status, absl::string_view message);
ConsoleResponse FromStatus(const absl::Status& st);

bool ValidUtf8(absl::string_view s);
// RFC 3339 in UTC with milliseconds; "" for the Unix epoch (a time never set).
std::string Rfc3339(absl::Time t);

// A request target: its path's segments and its query, percent-decoded.
struct Target {
  std::vector<std::string> segments;
  std::map<std::string, std::string> query;
};
Target ParseTarget(absl::string_view target);
// An integer parameter in [lo, hi]; `fallback` when absent; InvalidArgument naming the bounds.
absl::StatusOr<int> IntParam(const Target& t, const std::string& name, int fallback, int lo,
                             int hi);

// "malformed,permanent,..." (empty or "all": every kind); InvalidArgument for another word.
absl::StatusOr<DeadLetterKinds> ParseKinds(absl::string_view text);
// A body's "kinds" array (absent: every kind).
absl::StatusOr<DeadLetterKinds> KindsFromJson(const json& body);
json KindNames(DeadLetterKinds kinds);

// The opaque page token of a letter id, and back (InvalidArgument for a token not made here).
std::string EncodePageToken(absl::string_view after_id);
absl::StatusOr<std::string> DecodePageToken(absl::string_view token);

// What a search matches: every non-empty field must match.
struct LetterFilter {
  std::string id;       // the letter's id or its message's id, exact
  std::string biz_uid;  // exact
  std::string reason;   // a substring, ignoring ASCII case
  bool empty() const { return id.empty() && biz_uid.empty() && reason.empty(); }
};
absl::StatusOr<LetterFilter> FilterFromJson(const json& f);

// A letter with its envelope decoded (when it is one).
struct Decoded {
  const DeadLetter* letter;
  std::optional<Message> msg;
};
Decoded Decode(const DeadLetter& l);
bool Matches(const Decoded& d, const LetterFilter& f);
// A list's entry (reason and payload cut short); `cursor` is the id Fetch() returns it after.
json LetterSummary(const Decoded& d, absl::string_view cursor);
// One letter in full: headers, trace id, payload as text, pretty JSON and hex.
json LetterDetail(const Decoded& d);

// The embedded page file `path` (index.html, console.js, console.css), or 404.
ConsoleResponse Asset(absl::string_view path);

// Equal length and bytes, in time independent of where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace bus::console_internal

#endif  // ADMIN_INTERNAL_CONSOLE_JSON_H_
