// The library's version (the file VERSION at the top of the repository, compiled in), for logs
// and for checking at run time which build a service links. What a version may change:
// docs/compatibility.md.

#ifndef BUS_VERSION_H_
#define BUS_VERSION_H_

#include "absl/strings/string_view.h"

namespace bus {

// "MAJOR.MINOR.PATCH", e.g. "0.5.0".
absl::string_view Version();

}  // namespace bus

#endif  // BUS_VERSION_H_
