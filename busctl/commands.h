// busctl's commands, one file each (publish.cc, queues.cc, dead_letters.cc, tail.cc, ui.cc);
// main.cc reads the command line and dispatches.
//
// A command comes in two parts: Check... finds usage errors in the flags and arguments before
// anything is opened (busctl exits 2), Run... does the work (an error exits 1).

#ifndef BUSCTL_COMMANDS_H_
#define BUSCTL_COMMANDS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bus/driver.h"
#include "bus/stores.h"
#include "busctl/flags.h"

namespace busctl {

// One run of a command.
struct Invocation {
  // The words after the command (and the dead-letters sub-command).
  std::vector<std::string> args{};
  // The flags that were given (CommandLine::given).
  std::set<std::string> given{};
  // --driver, else $BUS_DRIVER; --stores, else $BUS_STORES.
  std::string driver_url{};
  std::string stores_url{};

  bool Given(absl::string_view flag) const { return given.contains(std::string(flag)); }

  // The broker; InvalidArgument without a URL.
  absl::StatusOr<std::shared_ptr<bus::Driver>> Driver() const;
  // The dead-letter store; InvalidArgument without a URL.
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> DeadLetters() const;
};

std::optional<UsageError> CheckPublish(const Invocation& in);
absl::Status RunPublish(const Invocation& in);

absl::Status RunQueues(const Invocation& in);
absl::Status RunStats(const Invocation& in);

std::optional<UsageError> CheckDeadList(const Invocation& in);
absl::Status RunDeadList(const Invocation& in);
std::optional<UsageError> CheckDeadShow(const Invocation& in);
absl::Status RunDeadShow(const Invocation& in);
std::optional<UsageError> CheckDeadReplay(const Invocation& in);
absl::Status RunDeadReplay(const Invocation& in);
absl::Status RunDeadPurge(const Invocation& in);
absl::Status RunDeadCount(const Invocation& in);

absl::Status RunTail(const Invocation& in);

// ui.cc
std::optional<UsageError> CheckUi(const Invocation& in);
absl::Status RunUi(const Invocation& in);

}  // namespace busctl

#endif  // BUSCTL_COMMANDS_H_
