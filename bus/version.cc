#include "bus/version.h"

#include "bus/version_number.h"

namespace bus {

absl::string_view Version() { return BUS_VERSION_STRING; }

}  // namespace bus
