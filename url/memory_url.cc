// memory:// URLs (memory_url.h says their parameter).

#include "url/memory_url.h"

#include "absl/strings/str_cat.h"
#include "url/internal/url_parts.h"

namespace bus {

using url_internal::Bad;
using url_internal::NoUserOrPath;
using url_internal::Params;

absl::StatusOr<MemoryUrlOptions> MemoryOptionsFromUrl(const ParsedUrl& url) {
  if (url.scheme != "memory") {
    return Bad("scheme", absl::StrCat("want memory://, got ", url.scheme));
  }
  if (absl::Status st = NoUserOrPath(url, false); !st.ok()) return st;
  if (!url.hosts.empty()) return Bad("host", "memory:// takes no host");
  MemoryUrlOptions o;
  Params p(url);
  p.Integer("max_message_bytes", &o.max_message_bytes);
  if (absl::Status st = p.Finish(); !st.ok()) return st;
  if (o.max_message_bytes == 0) return Bad("parameter max_message_bytes", "must be > 0");
  return o;
}

}  // namespace bus
