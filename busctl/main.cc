// busctl: look at and operate a bus from the command line, on every driver and store through
// connection URLs (url/url.h). docs/busctl.md is the manual; `busctl --help` lists every
// command and flag.
//
//   busctl --driver=redis://127.0.0.1:6379 --stores=sqlite:///var/lib/bus.db queues
//
// Exit codes: 0 done, 1 error (the Status text on stderr), 2 usage (a bad command, argument or
// flag, named on stderr).

#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "bus/logger.h"
#include "bus/version.h"
#include "busctl/commands.h"
#include "busctl/flags.h"
#include "url/open.h"

namespace busctl {
namespace {

constexpr char kUsage[] = R"(busctl: look at and operate a message bus.

Usage: busctl [global flags] COMMAND [ARGS] [flags]

Commands:
  publish QUEUE              send a message to QUEUE (payload from --data, else stdin);
                             prints the message id
  publish --topic T          publish to topic T instead (with --route-key)
  queues                     every queue: ready, delayed, in-flight, dead letters by kind
  stats QUEUE                the same for one queue
  dead-letters list QUEUE    the queue's dead letters, oldest first
  dead-letters show [QUEUE] ID   one letter, decoded (without QUEUE: every queue is searched)
  dead-letters replay QUEUE  send letters back to the queue (removed once accepted)
  dead-letters purge QUEUE   delete letters (needs --yes)
  dead-letters count QUEUE   letters by kind
  tail TOPIC                 bind a temporary queue to TOPIC and print what arrives
  ui --listen=HOST:PORT      serve the web console (docs/console.md) until interrupted

Global flags:
  --driver=URL     broker: memory://, redis[s]://..., nsq://..., amqp[s]://..., nats://...,
                   kafka://...
                   (default: $BUS_DRIVER)
  --stores=URL     dead-letter store: memory://, redis[s]://..., sqlite://..., postgres://...
                   (default: $BUS_STORES)
  --json           one JSON object per line instead of tables (default: false)
  --help           this text; `busctl COMMAND --help` for a command's flags
  --version        busctl's version (the library's, bus::Version())

Flags go before or after the command, as --name=value or --name value.
Exit codes: 0 done, 1 error, 2 usage (a bad command, argument or flag).
)";

struct CommandHelp {
  const char* name = nullptr;
  const char* text = nullptr;
};

constexpr CommandHelp kCommandHelp[] = {
    {"publish", R"(Usage: busctl publish QUEUE [flags]
       busctl publish --topic T [--route-key K] [flags]
Sends one message and prints its id.
  --topic=T        publish to topic T instead of a queue (default: none)
  --route-key=K    route key of a topic message (default: "")
  --biz-uid=U      business key for idempotency (default: the message id)
  --header=k=v     a header; repeat for more (default: none)
  --delay=D        deliver after D, like 30s or 5m (queues only; default: 0s)
  --data=S         the payload (default: read stdin to its end, without one trailing
                   newline: `echo hi | busctl publish q` sends "hi")
  --raw            with stdin: send its bytes exactly, a trailing newline too (default: false)
)"},
    {"queues", R"(Usage: busctl queues
Every queue the broker holds, with ready, delayed and in-flight counts and, when --stores is
given, the dead-letter count by kind.
)"},
    {"stats", R"(Usage: busctl stats QUEUE
Ready, delayed and in-flight counts of QUEUE and, when --stores is given, its dead letters by
kind.
)"},
    {"dead-letters", R"(Usage: busctl dead-letters list|show|replay|purge|count ...
  list QUEUE [--kind=K] [--limit=N] [--since=T]
      --kind=K     malformed, permanent, exhausted or poison (default: every kind)
      --limit=N    at most N letters (default: 100)
      --since=T    only letters that failed last at or after T: RFC 3339
                   (2024-05-01T12:00:00Z) or a duration ago (1h) (default: all)
  show [QUEUE] ID
      the decoded letter: id, biz_uid, kind, reason, attempts, times, headers, payload
      (as text when printable, else hex)
  replay QUEUE [--id=ID ... | --kind=K | --all]
      sends letters back to QUEUE, each removed once the broker accepted it
      --id=ID      this letter; repeat for more (default: none)
      --kind=K     every letter of kind K (default: none)
      --all        every letter (default: false)
  purge QUEUE [--kind=K] --yes
      deletes the queue's letters (of kind K; default every kind); refuses without --yes
  count QUEUE [--kind=K]
      letters by kind
)"},
    {"tail", R"(Usage: busctl tail TOPIC [--route-key=K]
Binds a temporary queue (tail-<random>) to TOPIC and prints each message as it arrives, one per
line (created time, id, route key, payload as text when printable, else hex; --json: one
object per line), until interrupted (Ctrl-C, SIGTERM); then removes the binding and the queue
and exits 0. The temporary queue's messages are acked.
  --route-key=K    binding key (default: "", every message)
)"},
    {"ui", R"(Usage: busctl ui --listen=HOST:PORT
Serves the web console (docs/console.md) for the broker (--driver) and the dead-letter store
(--stores, optional) at http://HOST:PORT/ui until interrupted (Ctrl-C, SIGTERM). Read-only
unless $BUS_CONSOLE_WRITE_TOKEN is set (writes then need it as a bearer token); no Handler runs
here, so its dead letters can be purged but not replayed.
  --listen=HOST:PORT   an IP address and port, e.g. 127.0.0.1:8080 (port 0: a free one)
)"},
};

// What a command needs besides its flags.
enum Needs : unsigned {
  kNothing = 0,
  kDriver = 1,  // --driver (or BUS_DRIVER)
  kStores = 2,  // --stores (or BUS_STORES)
};

struct Command {
  const char* name = nullptr;  // "publish", or "dead-letters list"
  // The flags it takes besides --driver, --stores and --json.
  std::set<std::string> flags{};
  // How many words may follow the name.
  size_t min_args = 0;
  size_t max_args = 0;
  const char* usage = nullptr;  // shown when the words are wrong
  unsigned needs = kNothing;
  std::optional<UsageError> (*check)(const Invocation&) = nullptr;
  absl::Status (*run)(const Invocation&) = nullptr;
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"publish",
       {"topic", "route_key", "biz_uid", "header", "delay", "data", "raw"},
       0,
       1,
       "publish QUEUE [flags]",
       kDriver,
       CheckPublish,
       RunPublish},
      {"queues", {}, 0, 0, "queues", kDriver, nullptr, RunQueues},
      {"stats", {}, 1, 1, "stats QUEUE", kDriver, nullptr, RunStats},
      {"dead-letters list",
       {"kind", "limit", "since"},
       1,
       1,
       "dead-letters list QUEUE [flags]",
       kStores,
       CheckDeadList,
       RunDeadList},
      {"dead-letters show",
       {},
       1,
       2,
       "dead-letters show [QUEUE] ID",
       kStores,
       CheckDeadShow,
       RunDeadShow},
      {"dead-letters replay",
       {"id", "kind", "all"},
       1,
       1,
       "dead-letters replay QUEUE [--id ID|--kind K|--all]",
       kDriver | kStores,
       CheckDeadReplay,
       RunDeadReplay},
      {"dead-letters purge",
       {"kind", "yes"},
       1,
       1,
       "dead-letters purge QUEUE [--kind K] --yes",
       kStores,
       nullptr,
       RunDeadPurge},
      {"dead-letters count",
       {"kind"},
       1,
       1,
       "dead-letters count QUEUE [--kind K]",
       kStores,
       nullptr,
       RunDeadCount},
      {"tail", {"route_key"}, 1, 1, "tail TOPIC [--route-key K]", kDriver, nullptr, RunTail},
      {"ui", {"listen"}, 0, 0, "ui --listen=HOST:PORT", kDriver, CheckUi, RunUi},
  };
  return *commands;
}

std::string EnvOr(const std::string& flag, const char* env) {
  if (!flag.empty()) return flag;
  const char* v = std::getenv(env);
  return v == nullptr ? "" : v;
}

// The command that `words` name and the Invocation for it; a UsageError when they name none
// or the line does not fit it.
std::variant<std::pair<const Command*, Invocation>, UsageError> Resolve(const CommandLine& line) {
  const std::vector<std::string>& words = line.positional;
  std::string name = words[0];
  size_t used = 1;
  if (name == "dead-letters") {
    if (words.size() < 2)
      return UsageError{"dead-letters needs list, show, replay, purge or count"};
    name = absl::StrCat(name, " ", words[1]);
    used = 2;
  }
  const Command* cmd = nullptr;
  for (const Command& c : Commands()) {
    if (name == c.name) cmd = &c;
  }
  if (cmd == nullptr) {
    return UsageError{used == 2 ? absl::StrCat("unknown dead-letters command \"", words[1], "\"")
                                : absl::StrCat("unknown command \"", name, "\"")};
  }
  for (const std::string& f : line.given) {
    if (f == "driver" || f == "stores" || f == "json" || cmd->flags.contains(f)) continue;
    return UsageError{
        absl::StrCat(cmd->name, " takes no flag --", absl::StrReplaceAll(f, {{"_", "-"}}))};
  }
  Invocation in;
  in.args.assign(words.begin() + static_cast<std::ptrdiff_t>(used), words.end());
  in.given = line.given;
  in.driver_url = EnvOr(absl::GetFlag(FLAGS_driver), "BUS_DRIVER");
  in.stores_url = EnvOr(absl::GetFlag(FLAGS_stores), "BUS_STORES");
  if (in.args.size() < cmd->min_args || in.args.size() > cmd->max_args) {
    return UsageError{absl::StrCat("usage: busctl ", cmd->usage)};
  }
  if (cmd->check != nullptr) {
    if (std::optional<UsageError> e = cmd->check(in)) return *e;
  }
  if ((cmd->needs & kDriver) != 0 && in.driver_url.empty()) {
    return UsageError{"no broker: give --driver=URL (or set BUS_DRIVER)"};
  }
  if ((cmd->needs & kStores) != 0 && in.stores_url.empty()) {
    return UsageError{"no store: give --stores=URL (or set BUS_STORES)"};
  }
  return std::make_pair(cmd, std::move(in));
}

int Usage(const UsageError& e) {
  std::cerr << "busctl: " << e.message << "\nRun 'busctl --help' for usage.\n";
  return 2;
}

}  // namespace

absl::StatusOr<std::shared_ptr<bus::Driver>> Invocation::Driver() const {
  if (driver_url.empty()) {
    return absl::InvalidArgumentError("no broker: give --driver=URL (or set BUS_DRIVER)");
  }
  return bus::OpenDriver(driver_url, {.logger = bus::StderrLogger(bus::LogLevel::kError)});
}

absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> Invocation::DeadLetters() const {
  if (stores_url.empty()) {
    return absl::InvalidArgumentError("no store: give --stores=URL (or set BUS_STORES)");
  }
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> store =
      bus::OpenDeadLetterStore(stores_url);
  if (store.ok() || !absl::IsPermissionDenied(store.status()) ||
      !absl::StartsWithIgnoreCase(stores_url, "sqlite://") ||
      absl::StrContains(stores_url, "read_only=")) {
    return store;
  }
  // A SQLite file this user cannot write (a read-only mount, another user's file): opened for
  // reading, the reading commands work, and a writing one fails with the store's
  // PermissionDenied ("attempt to write a readonly database").
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> read_only = bus::OpenDeadLetterStore(
      absl::StrCat(stores_url, absl::StrContains(stores_url, '?') ? "&" : "?", "read_only=true"));
  return read_only.ok() ? read_only : store;
}

// Returns the exit code.
int Run(int argc, char** argv) {
  std::variant<CommandLine, UsageError> parsed = ParseCommandLine(argc, argv);
  if (const auto* e = std::get_if<UsageError>(&parsed)) return Usage(*e);
  const CommandLine& line = std::get<CommandLine>(parsed);
  if (line.version) {
    std::cout << "busctl " << bus::Version() << "\n";
    return 0;
  }
  const std::string cmd = line.positional.empty() ? "" : line.positional[0];
  if (line.help) {
    for (const CommandHelp& h : kCommandHelp) {
      if (cmd == h.name) {
        std::cout << h.text;
        return 0;
      }
    }
    std::cout << kUsage;
    return cmd.empty() ? 0 : 2;
  }
  if (cmd.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  auto resolved = Resolve(line);
  if (const auto* e = std::get_if<UsageError>(&resolved)) return Usage(*e);
  auto& [command, invocation] = std::get<0>(resolved);
  if (absl::Status st = command->run(invocation); !st.ok()) {
    std::cerr << "busctl: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace busctl

int main(int argc, char** argv) { return busctl::Run(argc, argv); }
