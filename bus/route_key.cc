#include "bus/route_key.h"

#include <vector>

#include "absl/strings/str_split.h"

namespace bus {

bool RouteKeyMatches(absl::string_view binding_key, absl::string_view route_key) {
  if (binding_key.empty()) return true;
  const std::vector<absl::string_view> pattern = absl::StrSplit(binding_key, '.');
  // An empty route key has no words: only bindings made of '#' alone match it.
  std::vector<absl::string_view> words;
  if (!route_key.empty()) words = absl::StrSplit(route_key, '.');
  // Iterative wildcard matching with backtracking to the most recent '#', which is linear in
  // practice and never recurses (a hostile key cannot blow the stack).
  size_t p = 0;
  size_t w = 0;
  size_t star_p = std::string::npos;  // position of the last '#' seen
  size_t star_w = 0;                  // words it has consumed up to
  while (w < words.size()) {
    if (p < pattern.size() && pattern[p] == "#") {
      star_p = p++;
      star_w = w;
    } else if (p < pattern.size() && (pattern[p] == "*" || pattern[p] == words[w])) {
      ++p;
      ++w;
    } else if (star_p != std::string::npos) {
      p = star_p + 1;
      w = ++star_w;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == "#") ++p;
  return p == pattern.size();
}

}  // namespace bus
