// busctl: look at and operate a bus from the command line, on every driver and store through
// connection URLs (url/url.h). docs/busctl.md is the manual; `busctl --help` lists every
// command and flag.
//
//   busctl --driver=redis://127.0.0.1:6379 --stores=sqlite:///var/lib/bus.db queues
//
// Exit codes: 0 done, 1 error (the Status text on stderr), 2 usage.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bus/driver.h"
#include "bus/envelope.h"
#include "bus/logger.h"
#include "bus/message.h"
#include "bus/publisher.h"
#include "bus/stores.h"
#include "nlohmann/json.hpp"
#include "url/open.h"
#include "url/url.h"

namespace {

using Json = nlohmann::ordered_json;

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

Global flags:
  --driver=URL     broker: memory://, redis://..., nsq://... (default: $BUS_DRIVER)
  --stores=URL     dead-letter store: memory://, redis://..., sqlite://... (default: $BUS_STORES)
  --json           one JSON object per line instead of tables (default: false)
  --help           this text; `busctl COMMAND --help` for a command's flags

Exit codes: 0 done, 1 error, 2 usage.
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
  --data=S         the payload (default: read stdin to its end)
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
      --kind=K     malformed, permanent or exhausted (default: every kind)
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
};

// ---- Arguments ----

struct Args {
  std::vector<std::string> positional{};
  std::multimap<std::string, std::string> flags{};

  bool Has(const std::string& name) const { return flags.count(name) > 0; }
  std::optional<std::string> Get(const std::string& name) const {
    auto it = flags.find(name);
    if (it == flags.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> All(const std::string& name) const {
    std::vector<std::string> out;
    auto [a, b] = flags.equal_range(name);
    for (auto it = a; it != b; ++it) out.push_back(it->second);
    return out;
  }
};

struct UsageError {
  std::string message{};
};

const std::set<std::string>& BoolFlags() {
  static const std::set<std::string> f = {"json", "help", "yes", "all"};
  return f;
}

// --name=value, --name value, and boolean --name. Everything else is positional.
std::optional<UsageError> ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) args->positional.push_back(argv[i]);
      break;
    }
    if (!absl::StartsWith(a, "--") || a.size() == 2) {
      args->positional.push_back(a);
      continue;
    }
    a = a.substr(2);
    const size_t eq = a.find('=');
    std::string name = a.substr(0, eq);
    if (eq != std::string::npos) {
      args->flags.emplace(name, a.substr(eq + 1));
    } else if (BoolFlags().count(name) > 0) {
      args->flags.emplace(name, "true");
    } else if (i + 1 < argc) {
      args->flags.emplace(name, argv[++i]);
    } else {
      return UsageError{absl::StrCat("flag --", name, " needs a value")};
    }
  }
  return std::nullopt;
}

// ---- Output ----

bool g_json = false;

std::string Time(absl::Time t) {
  if (t == absl::UnixEpoch()) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t i = 0; i < r.size(); ++i) {
      if (i + 1 == r.size()) {
        absl::StrAppend(&out, r[i]);
      } else {
        absl::StrAppend(&out, r[i], std::string(width[i] - r[i].size() + 2, ' '));
      }
    }
    std::cout << out << "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
}

void PrintJson(const Json& j) { std::cout << j.dump() << "\n"; }

bool Printable(absl::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') return false;
    if (c == 0x7f) return false;
  }
  // Valid UTF-8 is what nlohmann::json accepts; check it so text payloads print as text.
  try {
    (void)Json(std::string(s)).dump();
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// A progress line on stderr for work that takes more than a second.
class Progress {
 public:
  explicit Progress(std::string verb) : verb_(std::move(verb)), thread_([this] { Loop(); }) {}
  ~Progress() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (printed_) std::cerr << "\r" << verb_ << " " << count.load() << "\n";
  }
  std::atomic<int64_t> count{0};

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; })) {
      std::cerr << "\r" << verb_ << " " << count.load() << "..." << std::flush;
      printed_ = true;
    }
  }
  std::string verb_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool printed_ = false;
  std::thread thread_;
};

// ---- Context ----

struct Context {
  Args args{};
  std::string driver_url{};
  std::string stores_url{};

  absl::StatusOr<std::shared_ptr<bus::Driver>> Driver() const {
    if (driver_url.empty()) {
      return absl::InvalidArgumentError("no broker: give --driver=URL (or set BUS_DRIVER)");
    }
    return bus::OpenDriver(driver_url, {.logger = bus::StderrLogger(bus::LogLevel::kError)});
  }
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> DeadLetters() const {
    if (stores_url.empty()) {
      return absl::InvalidArgumentError("no store: give --stores=URL (or set BUS_STORES)");
    }
    return bus::OpenDeadLetterStore(stores_url);
  }
};

absl::StatusOr<bus::DeadLetterKinds> KindsFlag(const Args& args) {
  std::optional<std::string> k = args.Get("kind");
  if (!k.has_value()) return bus::AllDeadLetterKinds();
  absl::StatusOr<bus::DeadLetterKind> kind = bus::ParseDeadLetterKind(*k);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kind: \"", *k, "\" is not malformed, permanent or exhausted"));
  }
  return bus::DeadLetterKinds{*kind};
}

// Every flag a command accepts; any other is a usage error.
std::optional<UsageError> CheckFlags(const Args& args, std::set<std::string> allowed) {
  allowed.insert({"driver", "stores", "json", "help"});
  for (const auto& [name, value] : args.flags) {
    if (allowed.count(name) == 0) return UsageError{absl::StrCat("unknown flag --", name)};
  }
  return std::nullopt;
}

std::optional<UsageError> Positional(const Args& args, size_t min, size_t max,
                                     absl::string_view what) {
  // positional[0] is the command (and [1] the sub-command for dead-letters).
  const size_t n = args.positional.size();
  if (n < min || n > max) return UsageError{absl::StrCat("usage: busctl ", what)};
  return std::nullopt;
}

// ---- Commands ----

absl::Status Publish(const Context& ctx) {
  const Args& a = ctx.args;
  std::optional<std::string> topic = a.Get("topic");
  std::string queue = a.positional.size() > 1 ? a.positional[1] : "";
  bus::Outgoing out;
  out.biz_uid = a.Get("biz-uid").value_or("");
  for (const std::string& h : a.All("header")) {
    const size_t eq = h.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--header: want k=v, got \"", h, "\""));
    }
    out.headers.emplace_back(h.substr(0, eq), h.substr(eq + 1));
  }
  absl::Duration delay = absl::ZeroDuration();
  if (auto d = a.Get("delay")) {
    if (!absl::ParseDuration(*d, &delay) || delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--delay: \"", *d, "\" is not a duration"));
    }
    if (topic.has_value() && delay > absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--delay: topics take no delay");
    }
  }
  if (auto data = a.Get("data")) {
    out.payload = *data;
  } else {
    out.payload.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = ctx.Driver();
  if (!driver.ok()) return driver.status();
  absl::StatusOr<bus::Publisher> publisher = bus::Publisher::Create(*driver);
  if (!publisher.ok()) return publisher.status();
  absl::StatusOr<std::string> id =
      topic.has_value()
          ? publisher->PublishToTopic(*topic, a.Get("route-key").value_or(""), std::move(out))
          : publisher->SendToQueue(queue, std::move(out), delay);
  if (!id.ok()) return id.status();
  if (g_json) {
    PrintJson({{"id", *id}});
  } else {
    std::cout << *id << "\n";
  }
  return absl::OkStatus();
}

absl::Status QueueRows(const Context& ctx, const std::vector<std::string>& queues,
                       bus::Driver& driver) {
  std::shared_ptr<bus::DeadLetterStore> dl;
  if (!ctx.stores_url.empty()) {
    absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> s = ctx.DeadLetters();
    if (!s.ok()) return s.status();
    dl = *s;
  }
  std::vector<std::vector<std::string>> rows;
  for (const std::string& q : queues) {
    absl::StatusOr<bus::QueueCounts> c = driver.InspectQueue(q);
    if (!c.ok()) return c.status();
    Json j = {
        {"queue", q}, {"ready", c->ready}, {"delayed", c->delayed}, {"in_flight", c->in_flight}};
    std::vector<std::string> row = {q, absl::StrCat(c->ready), absl::StrCat(c->delayed),
                                    absl::StrCat(c->in_flight)};
    if (dl != nullptr) {
      Json dead = Json::object();
      for (bus::DeadLetterKind k :
           {bus::DeadLetterKind::kMalformed, bus::DeadLetterKind::kPermanent,
            bus::DeadLetterKind::kExhausted}) {
        absl::StatusOr<int64_t> n = dl->Count(q, bus::DeadLetterKinds{k});
        if (!n.ok()) return n.status();
        dead[std::string(bus::DeadLetterKindName(k))] = *n;
        row.push_back(absl::StrCat(*n));
      }
      j["dead_letters"] = dead;
    }
    if (g_json) {
      PrintJson(j);
    } else {
      rows.push_back(std::move(row));
    }
  }
  if (!g_json) {
    std::vector<std::string> header = {"QUEUE", "READY", "DELAYED", "IN_FLIGHT"};
    if (dl != nullptr) header.insert(header.end(), {"MALFORMED", "PERMANENT", "EXHAUSTED"});
    PrintTable(header, rows);
  }
  return absl::OkStatus();
}

absl::Status Queues(const Context& ctx) {
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = ctx.Driver();
  if (!driver.ok()) return driver.status();
  absl::StatusOr<std::vector<std::string>> queues = (*driver)->ListQueues();
  if (!queues.ok()) return queues.status();
  return QueueRows(ctx, *queues, **driver);
}

absl::Status Stats(const Context& ctx) {
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = ctx.Driver();
  if (!driver.ok()) return driver.status();
  return QueueRows(ctx, {ctx.args.positional[1]}, **driver);
}

// payload_encoding ("text" when printable, else "hex") and payload.
void AddPayload(absl::string_view payload, Json* j) {
  if (Printable(payload)) {
    (*j)["payload_encoding"] = "text";
    (*j)["payload"] = std::string(payload);
  } else {
    (*j)["payload_encoding"] = "hex";
    (*j)["payload"] = absl::BytesToHexString(payload);
  }
}

Json HeadersJson(const bus::Message& msg) {
  Json headers = Json::object();
  for (const auto& [k, v] : msg.headers) {
    headers[Printable(k) ? k : absl::BytesToHexString(k)] =
        Printable(v) ? v : absl::BytesToHexString(v);
  }
  return headers;
}

Json LetterJson(const bus::DeadLetter& l, bool full) {
  Json j = {{"id", l.id},
            {"queue", l.queue},
            {"message_id", l.message_id},
            {"kind", std::string(bus::DeadLetterKindName(l.kind))},
            {"reason", l.reason},
            {"attempts", l.attempts},
            {"replays", l.replays},
            {"first_failed_at", Time(l.first_failed_at)},
            {"last_failed_at", Time(l.last_failed_at)},
            {"stored_at", Time(l.stored_at)}};
  if (!full) return j;
  absl::StatusOr<bus::Message> msg = bus::DecodeEnvelope(l.data, l.data.size() + 1);
  absl::string_view payload = l.data;
  if (msg.ok()) {
    j["biz_uid"] = msg->biz_uid;
    j["created_at"] = Time(msg->created_at);
    j["route_key"] = msg->route_key;
    j["last_error"] = msg->last_error;
    j["headers"] = HeadersJson(*msg);
    payload = msg->payload;
  } else {
    j["envelope_error"] = std::string(msg.status().message());
  }
  AddPayload(payload, &j);
  return j;
}

absl::StatusOr<absl::Time> SinceFlag(const Args& a) {
  std::optional<std::string> s = a.Get("since");
  if (!s.has_value()) return absl::InfinitePast();
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, *s, &t, &err)) return t;
  absl::Duration ago;
  if (absl::ParseDuration(*s, &ago) && ago >= absl::ZeroDuration()) return absl::Now() - ago;
  return absl::InvalidArgumentError(
      absl::StrCat("--since: \"", *s, "\" is neither an RFC 3339 time nor a duration"));
}

absl::Status DeadList(const Context& ctx) {
  const Args& a = ctx.args;
  const std::string& queue = a.positional[2];
  absl::StatusOr<bus::DeadLetterKinds> kinds = KindsFlag(a);
  if (!kinds.ok()) return kinds.status();
  int limit = 100;
  if (auto l = a.Get("limit"); l.has_value() && (!absl::SimpleAtoi(*l, &limit) || limit < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--limit: \"", *l, "\" is not >= 1"));
  }
  absl::StatusOr<absl::Time> since = SinceFlag(a);
  if (!since.ok()) return since.status();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = ctx.DeadLetters();
  if (!dl.ok()) return dl.status();
  std::vector<std::vector<std::string>> rows;
  std::string after;
  int shown = 0;
  while (shown < limit) {
    absl::StatusOr<std::vector<bus::DeadLetter>> batch = (*dl)->Fetch(queue, 500, after, *kinds);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    after = batch->back().id;
    for (const bus::DeadLetter& l : *batch) {
      if (l.last_failed_at < *since) continue;
      if (shown++ >= limit) break;
      if (g_json) {
        PrintJson(LetterJson(l, false));
      } else {
        std::string reason = l.reason.substr(0, 60);
        if (l.reason.size() > 60) reason += "...";
        rows.push_back({l.id, std::string(bus::DeadLetterKindName(l.kind)),
                        absl::StrCat(l.attempts), Time(l.last_failed_at),
                        absl::CHexEscape(reason)});
      }
    }
  }
  if (!g_json) PrintTable({"ID", "KIND", "ATTEMPTS", "LAST_FAILED", "REASON"}, rows);
  return absl::OkStatus();
}

// The letter `id` of `queue`, walking the queue in batches; NotFound when absent.
absl::StatusOr<bus::DeadLetter> FindLetter(bus::DeadLetterStore& dl, const std::string& queue,
                                           const std::string& id) {
  std::string after;
  for (;;) {
    absl::StatusOr<std::vector<bus::DeadLetter>> batch = dl.Fetch(queue, 500, after);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    for (bus::DeadLetter& l : *batch) {
      if (l.id == id) return std::move(l);
    }
    after = batch->back().id;
  }
  return absl::NotFoundError(absl::StrCat("dead letter ", id, " not found in queue ", queue));
}

absl::Status DeadShow(const Context& ctx) {
  const Args& a = ctx.args;
  const bool with_queue = a.positional.size() == 4;
  const std::string& id = a.positional.back();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = ctx.DeadLetters();
  if (!dl.ok()) return dl.status();
  std::vector<std::string> queues;
  if (with_queue) {
    queues.push_back(a.positional[2]);
  } else {
    absl::StatusOr<std::shared_ptr<bus::Driver>> driver = ctx.Driver();
    if (!driver.ok()) {
      return absl::Status(
          driver.status().code(),
          absl::StrCat("show without QUEUE lists the queues: ", driver.status().message()));
    }
    absl::StatusOr<std::vector<std::string>> all = (*driver)->ListQueues();
    if (!all.ok()) return all.status();
    queues = *all;
  }
  for (const std::string& q : queues) {
    absl::StatusOr<bus::DeadLetter> l = FindLetter(**dl, q, id);
    if (absl::IsNotFound(l.status())) continue;
    if (!l.ok()) return l.status();
    const Json j = LetterJson(*l, true);
    if (g_json) {
      PrintJson(j);
      return absl::OkStatus();
    }
    for (const auto& [k, v] : j.items()) {
      if (k == "headers") {
        std::cout << "headers:\n";
        for (const auto& [hk, hv] : v.items()) {
          std::cout << "  " << hk << ": " << hv.get<std::string>() << "\n";
        }
      } else {
        std::cout << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
      }
    }
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("dead letter ", id, " not found"));
}

// The replay count travels in this header, as the Handler's replay sets it (bus/pipeline.cc).
constexpr char kReplaysHeader[] = "bus-replays";

absl::Status DeadReplay(const Context& ctx) {
  const Args& a = ctx.args;
  const std::string& queue = a.positional[2];
  const std::vector<std::string> ids = a.All("id");
  const int selectors = (ids.empty() ? 0 : 1) + (a.Has("kind") ? 1 : 0) + (a.Has("all") ? 1 : 0);
  if (selectors != 1) {
    return absl::InvalidArgumentError("replay: give exactly one of --id, --kind or --all");
  }
  absl::StatusOr<bus::DeadLetterKinds> kinds = KindsFlag(a);
  if (!kinds.ok()) return kinds.status();
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = ctx.Driver();
  if (!driver.ok()) return driver.status();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = ctx.DeadLetters();
  if (!dl.ok()) return dl.status();
  std::set<std::string> wanted(ids.begin(), ids.end());
  Progress progress("replayed");
  std::string after;
  for (;;) {
    absl::StatusOr<std::vector<bus::DeadLetter>> batch = (*dl)->Fetch(queue, 500, after, *kinds);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    after = batch->back().id;
    for (const bus::DeadLetter& l : *batch) {
      if (!wanted.empty() && wanted.count(l.id) == 0) continue;
      std::string data = l.data;
      if (absl::StatusOr<bus::Message> msg = bus::DecodeEnvelope(l.data, l.data.size() + 1);
          msg.ok()) {
        std::erase_if(msg->headers, [](const auto& h) { return h.first == kReplaysHeader; });
        msg->headers.emplace_back(kReplaysHeader, absl::StrCat(l.replays + 1));
        data = bus::EncodeEnvelope(*msg);
      }
      if (absl::Status st = (*driver)->SendToQueue(queue, data, absl::ZeroDuration()); !st.ok()) {
        return st;
      }
      if (absl::Status st = (*dl)->Remove(queue, l.id); !st.ok()) return st;
      wanted.erase(l.id);
      progress.count.fetch_add(1);
      if (!ids.empty() && wanted.empty()) break;
    }
    if (!ids.empty() && wanted.empty()) break;
  }
  const int64_t n = progress.count.load();
  if (!wanted.empty()) {
    return absl::NotFoundError(
        absl::StrCat("replayed ", n, "; not found: ", absl::StrJoin(wanted, ", ")));
  }
  if (g_json) {
    PrintJson({{"queue", queue}, {"replayed", n}});
  } else {
    std::cout << "replayed " << n << "\n";
  }
  return absl::OkStatus();
}

absl::Status DeadPurge(const Context& ctx) {
  const Args& a = ctx.args;
  const std::string& queue = a.positional[2];
  if (!a.Has("yes")) {
    return absl::FailedPreconditionError(
        absl::StrCat("purge deletes dead letters of ", queue, " for good; add --yes"));
  }
  absl::StatusOr<bus::DeadLetterKinds> kinds = KindsFlag(a);
  if (!kinds.ok()) return kinds.status();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = ctx.DeadLetters();
  if (!dl.ok()) return dl.status();
  absl::StatusOr<int64_t> before = (*dl)->Count(queue, *kinds);
  if (!before.ok()) return before.status();
  {
    Progress progress("purging");
    if (absl::Status st = (*dl)->Purge(queue, *kinds); !st.ok()) return st;
  }
  absl::StatusOr<int64_t> left = (*dl)->Count(queue, *kinds);
  if (!left.ok()) return left.status();
  const int64_t purged = std::max<int64_t>(0, *before - *left);
  if (g_json) {
    PrintJson({{"queue", queue}, {"purged", purged}});
  } else {
    std::cout << "purged " << purged << "\n";
  }
  return absl::OkStatus();
}

absl::Status DeadCount(const Context& ctx) {
  const Args& a = ctx.args;
  const std::string& queue = a.positional[2];
  absl::StatusOr<bus::DeadLetterKinds> kinds = KindsFlag(a);
  if (!kinds.ok()) return kinds.status();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = ctx.DeadLetters();
  if (!dl.ok()) return dl.status();
  Json j = {{"queue", queue}};
  std::vector<std::string> row = {queue};
  int64_t total = 0;
  for (bus::DeadLetterKind k : {bus::DeadLetterKind::kMalformed, bus::DeadLetterKind::kPermanent,
                                bus::DeadLetterKind::kExhausted}) {
    int64_t n = 0;
    if (kinds->Contains(k)) {
      absl::StatusOr<int64_t> c = (*dl)->Count(queue, bus::DeadLetterKinds{k});
      if (!c.ok()) return c.status();
      n = *c;
    }
    j[std::string(bus::DeadLetterKindName(k))] = n;
    row.push_back(absl::StrCat(n));
    total += n;
  }
  j["total"] = total;
  row.push_back(absl::StrCat(total));
  if (g_json) {
    PrintJson(j);
  } else {
    PrintTable({"QUEUE", "MALFORMED", "PERMANENT", "EXHAUSTED", "TOTAL"}, {row});
  }
  return absl::OkStatus();
}

// One line for a message that `tail` received: the decoded envelope (a body that is not one,
// from a foreign producer, is shown as the payload with id "-").
void PrintTailed(absl::string_view data) {
  absl::StatusOr<bus::Message> msg = bus::DecodeEnvelope(data, data.size() + 1);
  Json j = Json::object();
  absl::string_view payload = data;
  if (msg.ok()) {
    j["id"] = msg->id;
    j["biz_uid"] = msg->biz_uid;
    j["created_at"] = Time(msg->created_at);
    j["route_key"] = msg->route_key;
    j["headers"] = HeadersJson(*msg);
    payload = msg->payload;
  } else {
    j["envelope_error"] = std::string(msg.status().message());
  }
  AddPayload(payload, &j);
  if (g_json) {
    PrintJson(j);
  } else {
    // One line per message: line breaks in a text payload are shown escaped.
    std::string shown = j["payload"].get<std::string>();
    if (j["payload_encoding"] == "hex") {
      shown = "hex:" + shown;
    } else {
      shown = absl::StrReplaceAll(shown, {{"\n", "\\n"}, {"\r", "\\r"}});
    }
    auto field = [&](const char* k) {
      const std::string v = j.contains(k) ? j[k].get<std::string>() : "";
      return v.empty() ? std::string("-") : v;
    };
    std::cout << absl::StrFormat("%-24s  %-32s  %-12s  %s\n", field("created_at"), field("id"),
                                 field("route_key"), shown);
  }
  std::cout << std::flush;
}

// Binds a temporary queue, prints what arrives until SIGINT or SIGTERM, then removes the
// binding and the queue. The signals are blocked in every thread (the mask is inherited by the
// driver's threads, made after this) and taken by one thread with sigwait, which stops the
// receive; so cleanup runs on the main thread, outside any signal handler.
absl::Status Tail(const Context& ctx) {
  const std::string& topic = ctx.args.positional[1];
  const std::string key = ctx.args.Get("route-key").value_or("");
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::stop_source stop;
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    stop.request_stop();
  });
  // Ends the waiter when tail ends for another reason (an error).
  struct Join {
    std::thread& t;
    std::stop_source& stop;
    ~Join() {
      if (!stop.stop_requested()) pthread_kill(t.native_handle(), SIGTERM);
      t.join();
    }
  } join{waiter, stop};

  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = ctx.Driver();
  if (!driver.ok()) return driver.status();
  absl::BitGen gen;
  const std::string queue =
      absl::StrCat("tail-", absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
  if (absl::Status st = (*driver)->Subscribe(topic, queue, key); !st.ok()) return st;
  absl::Status result;
  {
    absl::StatusOr<std::unique_ptr<bus::Consumer>> consumer =
        (*driver)->NewConsumer(queue, {.max_in_flight = 64, .lease = absl::Seconds(30)});
    if (!consumer.ok()) {
      result = consumer.status();
    } else {
      std::cerr << "tailing topic " << topic << " (binding key \"" << key << "\") through queue "
                << queue << "; Ctrl-C to stop\n";
      if (!g_json) {
        std::cout << absl::StrFormat("%-24s  %-32s  %-12s  %s\n", "CREATED_AT", "ID", "ROUTE_KEY",
                                     "PAYLOAD")
                  << std::flush;
      }
      std::vector<bus::Delivery> got;
      while (!stop.stop_requested()) {
        got.clear();
        absl::Status st = (*consumer)->Receive(64, absl::Seconds(10), stop.get_token(), &got);
        if (!st.ok()) {
          result = st;
          break;
        }
        for (const bus::Delivery& d : got) {
          PrintTailed(d.data);
          (*consumer)->Ack(d.receipt).IgnoreError();  // an unacked copy goes with the queue
        }
      }
    }
    // The consumer closes here, before its queue goes.
  }
  // Both even when one fails; the first error is the result.
  absl::Status unbound = (*driver)->Unsubscribe(topic, queue, key);
  absl::Status deleted = (*driver)->DeleteQueue(queue);
  for (absl::Status* st : {&unbound, &deleted}) {
    if (result.ok() && !st->ok()) {
      result = absl::Status(st->code(),
                            absl::StrCat("removing temporary queue ", queue, ": ", st->message()));
    }
  }
  return result;
}

// Returns the exit code.
int Run(int argc, char** argv) {
  Context ctx;
  if (std::optional<UsageError> e = ParseArgs(argc, argv, &ctx.args)) {
    std::cerr << "busctl: " << e->message << "\nRun 'busctl --help' for usage.\n";
    return 2;
  }
  Args& a = ctx.args;
  g_json = a.Has("json");
  const std::string cmd = a.positional.empty() ? "" : a.positional[0];
  if (a.Has("help")) {
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
  auto env_or = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  ctx.driver_url = a.Get("driver").value_or(env_or("BUS_DRIVER"));
  ctx.stores_url = a.Get("stores").value_or(env_or("BUS_STORES"));

  std::optional<UsageError> usage;
  absl::Status (*fn)(const Context&) = nullptr;
  if (cmd == "publish") {
    usage = CheckFlags(a, {"topic", "route-key", "biz-uid", "header", "delay", "data"});
    if (!usage) {
      usage = a.Has("topic") ? Positional(a, 1, 1, "publish --topic T [flags] (no QUEUE)")
                             : Positional(a, 2, 2, "publish QUEUE [flags]");
    }
    if (!usage && a.Has("route-key") && !a.Has("topic")) {
      usage = UsageError{"--route-key needs --topic"};
    }
    fn = Publish;
  } else if (cmd == "queues") {
    usage = CheckFlags(a, {});
    if (!usage) usage = Positional(a, 1, 1, "queues");
    fn = Queues;
  } else if (cmd == "stats") {
    usage = CheckFlags(a, {});
    if (!usage) usage = Positional(a, 2, 2, "stats QUEUE");
    fn = Stats;
  } else if (cmd == "dead-letters") {
    const std::string sub = a.positional.size() > 1 ? a.positional[1] : "";
    if (sub == "list") {
      usage = CheckFlags(a, {"kind", "limit", "since"});
      if (!usage) usage = Positional(a, 3, 3, "dead-letters list QUEUE [flags]");
      fn = DeadList;
    } else if (sub == "show") {
      usage = CheckFlags(a, {});
      if (!usage) usage = Positional(a, 3, 4, "dead-letters show [QUEUE] ID");
      fn = DeadShow;
    } else if (sub == "replay") {
      usage = CheckFlags(a, {"id", "kind", "all"});
      if (!usage) usage = Positional(a, 3, 3, "dead-letters replay QUEUE [--id ID|--kind K|--all]");
      fn = DeadReplay;
    } else if (sub == "purge") {
      usage = CheckFlags(a, {"kind", "yes"});
      if (!usage) usage = Positional(a, 3, 3, "dead-letters purge QUEUE [--kind K] --yes");
      fn = DeadPurge;
    } else if (sub == "count") {
      usage = CheckFlags(a, {"kind"});
      if (!usage) usage = Positional(a, 3, 3, "dead-letters count QUEUE [--kind K]");
      fn = DeadCount;
    } else {
      usage = UsageError{sub.empty() ? "dead-letters needs list, show, replay, purge or count"
                                     : absl::StrCat("unknown dead-letters command \"", sub, "\"")};
    }
  } else if (cmd == "tail") {
    usage = CheckFlags(a, {"route-key"});
    if (!usage) usage = Positional(a, 2, 2, "tail TOPIC [--route-key K]");
    fn = Tail;
  } else {
    usage = UsageError{absl::StrCat("unknown command \"", cmd, "\"")};
  }
  if (usage) {
    std::cerr << "busctl: " << usage->message << "\nRun 'busctl --help' for usage.\n";
    return 2;
  }
  absl::Status st = fn(ctx);
  if (!st.ok()) {
    std::cerr << "busctl: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
