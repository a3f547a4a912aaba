#include "bus/names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace bus {

absl::Status ValidateName(absl::string_view what, absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name must be 1 to ", kMaxNameLength,
                                                   " characters, got ", name.size()));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s name \"%s\" has character 0x%02x at %d; allowed are [.a-zA-Z0-9_-]",
                          what, absl::CHexEscape(name), static_cast<unsigned char>(c), i));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRouteKey(absl::string_view key) {
  if (key.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("route key is ", key.size(), " bytes; the limit is 255"));
  }
  if (key.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("route key contains a NUL byte");
  }
  return absl::OkStatus();
}

}  // namespace bus
