// busctl ui: the command's flags and dispatch (the console itself is ui.cc).
#include <memory>
#include <optional>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "busctl/commands.h"
#include "busctl/flags.h"
#include "busctl/ui.h"

namespace busctl {

std::optional<UsageError> CheckUi(const Invocation& in) {
  (void)in;
  if (absl::Status st = ParseListen(absl::GetFlag(FLAGS_listen)).status(); !st.ok()) {
    return UsageError{absl::StrCat("--listen: ", st.message())};
  }
  return std::nullopt;
}

// The console's dead-letter store is optional: without --stores it shows the broker's counts.
absl::Status RunUi(const Invocation& in) {
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = in.Driver();
  if (!driver.ok()) return driver.status();
  std::shared_ptr<bus::DeadLetterStore> store;
  if (!in.stores_url.empty()) {
    absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> s = in.DeadLetters();
    if (!s.ok()) return s.status();
    store = *std::move(s);
  }
  return UiCommand(absl::GetFlag(FLAGS_listen), *std::move(driver), std::move(store));
}

}  // namespace busctl
