// busctl's flags, declared with absl/flags (defined in flags.cc), and the command line read into
// them.
//
// The syntax is Abseil's: `--name=value`, `--name value` (not for booleans), `--name` and
// `--noname` for booleans, and `--` ends the flags. A name may be spelled with '-' or '_'
// (`--route-key` is the flag route_key). Two flags take repeats, each adding a value:
// `--header` and `--id`. Every other word is positional (the command and its arguments), in
// any order with the flags.

#ifndef BUSCTL_FLAGS_H_
#define BUSCTL_FLAGS_H_

#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/stores.h"

namespace busctl {

// --kind: one dead-letter kind, or none (every kind).
struct KindFlag {
  std::optional<bus::DeadLetterKind> kind{};
  // The kinds a command works on: the one given, else every kind.
  bus::DeadLetterKinds Kinds() const {
    return kind.has_value() ? bus::DeadLetterKinds{*kind} : bus::AllDeadLetterKinds();
  }
};
bool AbslParseFlag(absl::string_view text, KindFlag* flag, std::string* error);
std::string AbslUnparseFlag(const KindFlag& flag);

// --since: an RFC 3339 time, or a duration before now (taken when the flag is read); unset is
// the infinite past.
struct SinceFlag {
  absl::Time at = absl::InfinitePast();
};
bool AbslParseFlag(absl::string_view text, SinceFlag* flag, std::string* error);
std::string AbslUnparseFlag(const SinceFlag& flag);

}  // namespace busctl

ABSL_DECLARE_FLAG(std::string, driver);
ABSL_DECLARE_FLAG(std::string, stores);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, topic);
ABSL_DECLARE_FLAG(std::string, route_key);
ABSL_DECLARE_FLAG(std::string, biz_uid);
ABSL_DECLARE_FLAG(std::vector<std::string>, header);
ABSL_DECLARE_FLAG(absl::Duration, delay);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(bool, raw);
ABSL_DECLARE_FLAG(busctl::KindFlag, kind);
ABSL_DECLARE_FLAG(int, limit);
ABSL_DECLARE_FLAG(busctl::SinceFlag, since);
ABSL_DECLARE_FLAG(std::vector<std::string>, id);
ABSL_DECLARE_FLAG(bool, all);
ABSL_DECLARE_FLAG(bool, yes);
ABSL_DECLARE_FLAG(std::string, listen);

namespace busctl {

// A usage error: a bad command line. Its text names the flag or argument; busctl exits 2.
struct UsageError {
  std::string message{};
};

// The command line once its flags are set.
struct CommandLine {
  // The command, its sub-command and arguments, in order.
  std::vector<std::string> positional{};
  // The names (as declared: route_key) of the flags given.
  std::set<std::string> given{};
  // --help and --version, which the parser takes itself (as Abseil's usage flags are).
  bool help = false;
  bool version = false;

  bool Given(absl::string_view name) const { return given.contains(std::string(name)); }
};

// Sets the flags from argv[1..argc) and returns the rest; a UsageError for an unknown flag, a
// value that does not parse (Abseil's message, which names the flag) or a missing value.
std::variant<CommandLine, UsageError> ParseCommandLine(int argc, char** argv);

}  // namespace busctl

#endif  // BUSCTL_FLAGS_H_
