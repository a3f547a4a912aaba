#include "busctl/flags.h"

#include <map>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

ABSL_FLAG(std::string, driver, "", "broker URL (default: $BUS_DRIVER)");
ABSL_FLAG(std::string, stores, "", "dead-letter store URL (default: $BUS_STORES)");
ABSL_FLAG(bool, json, false, "one JSON object per line instead of tables");
ABSL_FLAG(std::string, topic, "", "publish: the topic, instead of a queue");
ABSL_FLAG(std::string, route_key, "", "publish: route key of a topic message; tail: binding key");
ABSL_FLAG(std::string, biz_uid, "", "publish: business key for idempotency");
ABSL_FLAG(std::vector<std::string>, header, {}, "publish: a header k=v; repeat for more");
ABSL_FLAG(absl::Duration, delay, absl::ZeroDuration(), "publish: deliver after this long");
ABSL_FLAG(std::string, data, "", "publish: the payload (default: stdin)");
ABSL_FLAG(bool, raw, false, "publish: stdin exactly, with its trailing newline");
ABSL_FLAG(busctl::KindFlag, kind, {}, "dead-letters: malformed, permanent, exhausted or poison");
ABSL_FLAG(int, limit, 100, "dead-letters list: at most this many letters");
ABSL_FLAG(busctl::SinceFlag, since, {}, "dead-letters list: failed last at or after this");
ABSL_FLAG(std::vector<std::string>, id, {}, "dead-letters replay: this letter; repeat for more");
ABSL_FLAG(bool, all, false, "dead-letters replay: every letter");
ABSL_FLAG(bool, yes, false, "dead-letters purge: yes, delete them");
ABSL_FLAG(std::string, listen, "", "ui: HOST:PORT to serve the web console on");

namespace busctl {

bool AbslParseFlag(absl::string_view text, KindFlag* flag, std::string* error) {
  if (text.empty()) {
    flag->kind.reset();
    return true;
  }
  absl::StatusOr<bus::DeadLetterKind> kind = bus::ParseDeadLetterKind(text);
  if (!kind.ok()) {
    *error = "want malformed, permanent, exhausted or poison";
    return false;
  }
  flag->kind = *kind;
  return true;
}

std::string AbslUnparseFlag(const KindFlag& flag) {
  return flag.kind.has_value() ? std::string(bus::DeadLetterKindName(*flag.kind)) : "";
}

bool AbslParseFlag(absl::string_view text, SinceFlag* flag, std::string* error) {
  if (text.empty()) {
    flag->at = absl::InfinitePast();
    return true;
  }
  std::string ignored;
  if (absl::ParseTime(absl::RFC3339_full, text, &flag->at, &ignored)) return true;
  absl::Duration ago;
  if (absl::ParseDuration(text, &ago) && ago >= absl::ZeroDuration()) {
    // Letters carry wall-clock times: "1h" means an hour before the wall clock's now.
    flag->at = absl::Now() - ago;
    return true;
  }
  *error = "want an RFC 3339 time (2024-05-01T12:00:00Z) or a duration ago (1h)";
  return false;
}

std::string AbslUnparseFlag(const SinceFlag& flag) {
  if (flag.at == absl::InfinitePast()) return "";
  return absl::FormatTime(absl::RFC3339_full, flag.at, absl::UTCTimeZone());
}

namespace {

// The flags that take repeats, each occurrence adding one value (Abseil's own list parsing
// would split a value at commas, and a repeat would replace the earlier values).
const std::map<std::string, absl::Flag<std::vector<std::string>>*>& RepeatedFlags() {
  static const auto* flags = new std::map<std::string, absl::Flag<std::vector<std::string>>*>{
      {"header", &FLAGS_header}, {"id", &FLAGS_id}};
  return *flags;
}

}  // namespace

std::variant<CommandLine, UsageError> ParseCommandLine(int argc, char** argv) {
  CommandLine line;
  std::map<std::string, std::vector<std::string>> repeated;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) line.positional.emplace_back(argv[i]);
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--") || arg.empty()) {
      line.positional.emplace_back(argv[i]);
      continue;
    }
    const size_t eq = arg.find('=');
    const absl::string_view spelled = arg.substr(0, eq);
    std::optional<std::string> value;
    if (eq != absl::string_view::npos) value = std::string(arg.substr(eq + 1));
    const std::string name = absl::StrReplaceAll(spelled, {{"-", "_"}});
    if (name == "help" || name == "version") {
      if (value.has_value()) {
        return UsageError{absl::StrCat("flag --", spelled, " takes no value")};
      }
      (name == "help" ? line.help : line.version) = true;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) return UsageError{absl::StrCat("unknown flag --", spelled)};
    const bool is_bool = flag->IsOfType<bool>();
    if (negated && value.has_value()) {
      return UsageError{absl::StrCat("flag --", spelled, " takes no value")};
    }
    if (is_bool && !value.has_value()) {
      value = negated ? "false" : "true";
    } else if (!value.has_value()) {
      if (i + 1 >= argc) return UsageError{absl::StrCat("flag --", spelled, " needs a value")};
      value = argv[++i];
    }
    const std::string declared(flag->Name());
    line.given.insert(declared);
    if (RepeatedFlags().contains(declared)) {
      repeated[declared].push_back(*std::move(value));
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) return UsageError{error};
  }
  for (const auto& [name, values] : repeated) absl::SetFlag(RepeatedFlags().at(name), values);
  return line;
}

}  // namespace busctl
