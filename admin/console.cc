#include "admin/console.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <optional>
#include <set>
#include <stop_token>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "admin/internal/console_health.h"
#include "admin/internal/console_json.h"
#include "admin/internal/console_sampler.h"
#include "bus/backoff.h"
#include "bus/envelope.h"
#include "bus/names.h"

namespace bus {

using console_internal::Asset;
using console_internal::ConstantTimeEquals;
using console_internal::Decode;
using console_internal::Decoded;
using console_internal::DecodePageToken;
using console_internal::EncodePageToken;
using console_internal::Error;
using console_internal::FilterFromJson;
using console_internal::FromStatus;
using console_internal::HandlerState;
using console_internal::IntParam;
using console_internal::json;
using console_internal::Json;
using console_internal::JsonDepth;
using console_internal::kContentSecurityPolicy;
using console_internal::kDefaultPageLimit;
using console_internal::kFetchBatch;
using console_internal::KindNames;
using console_internal::KindsFromJson;
using console_internal::kMaxJsonDepth;
using console_internal::kMaxPageLimit;
using console_internal::kMaxPoints;
using console_internal::kMaxScanForIds;
using console_internal::kMaxScanPerRequest;
using console_internal::LetterDetail;
using console_internal::LetterFilter;
using console_internal::LetterSummary;
using console_internal::Matches;
using console_internal::MetricsSampler;
using console_internal::ParseKinds;
using console_internal::ParseTarget;
using console_internal::Rfc3339;
using console_internal::Target;

// The HTTP route table over the options and the metrics sampler
// (admin/internal/console_sampler.h).
struct Console::Impl {
  explicit Impl(ConsoleOptions o)
      : options(std::move(o)),
        sampler(options.handlers, *options.clock, options.sample_interval, options.history) {}

  const ConsoleOptions options;
  std::string token;
  MetricsSampler sampler;

  size_t SampleCount(size_t handler_index) const { return sampler.SampleCount(handler_index); }
  json Series(size_t handler_index, int points) const {
    return sampler.Series(handler_index, points);
  }

  // The handler consuming `queue` here, or -1.
  int HandlerIndex(absl::string_view queue) const {
    for (size_t i = 0; i < options.handlers.size(); ++i) {
      if (options.handlers[i]->options().queue == queue) return static_cast<int>(i);
    }
    return -1;
  }

  DeadLetterStore* StoreFor(absl::string_view queue) const {
    const int i = HandlerIndex(queue);
    if (i >= 0)
      return options.handlers[static_cast<size_t>(i)]->options().stores.dead_letters.get();
    return options.dead_letters.get();
  }

  // The broker's queues and those of the handlers, sorted; the driver's error when it cannot
  // list and no handler names a queue.
  absl::StatusOr<std::vector<std::string>> QueueNames() const {
    std::set<std::string> names;
    for (Handler* h : options.handlers) names.insert(h->options().queue);
    absl::StatusOr<std::vector<std::string>> listed = options.driver->ListQueues();
    if (listed.ok()) {
      names.insert(listed->begin(), listed->end());
    } else if (names.empty()) {
      return listed.status();
    }
    return std::vector<std::string>(names.begin(), names.end());
  }

  // OK when `queue` is a valid name the console knows; NotFound or InvalidArgument otherwise.
  absl::Status KnownQueue(absl::string_view queue) const {
    if (absl::Status st = ValidateName("queue", queue); !st.ok()) return st;
    if (HandlerIndex(queue) >= 0) return absl::OkStatus();
    absl::StatusOr<std::vector<std::string>> names = QueueNames();
    if (!names.ok()) return names.status();
    if (std::find(names->begin(), names->end(), queue) == names->end()) {
      return absl::NotFoundError(absl::StrCat("no queue named ", queue));
    }
    return absl::OkStatus();
  }

  json QueueJson(const std::string& name, int points, bool counts_from_broker) const {
    json q = {{"name", name}};
    if (counts_from_broker) {
      absl::StatusOr<QueueCounts> c = options.driver->InspectQueue(name);
      if (c.ok()) {
        q["ready"] = c->ready;
        q["delayed"] = c->delayed;
        q["in_flight"] = c->in_flight;
        q["next_due"] = c->next_due == absl::InfiniteFuture() ? "" : Rfc3339(c->next_due);
      } else {
        q["ready"] = q["delayed"] = q["in_flight"] = nullptr;
        q["counts_error"] = c.status().ToString();
      }
    }
    if (DeadLetterStore* store = StoreFor(name)) {
      absl::StatusOr<int64_t> n = store->Count(name, AllDeadLetterKinds());
      q["dead_letters"] = n.ok() ? json(*n) : json(nullptr);
      if (!n.ok()) q["dead_letters_error"] = n.status().ToString();
    } else {
      q["dead_letters"] = nullptr;
    }
    const int i = HandlerIndex(name);
    if (i < 0) {
      q["handler"] = nullptr;
      return q;
    }
    const Handler* h = options.handlers[static_cast<size_t>(i)];
    const HandlerStats s = h->Stats();
    q["handler"] = {{"state", HandlerState(s)},
                    {"received", s.received},
                    {"handled", s.succeeded},
                    {"failed", s.failed},
                    {"retried", s.retried},
                    {"dead_lettered", s.dead_lettered},
                    {"duplicates", s.duplicates},
                    {"replayed", s.replayed},
                    {"in_flight", s.in_flight},
                    {"concurrency", h->options().flow.concurrency},
                    {"latency_p50_ms", absl::ToDoubleMilliseconds(s.latency_p50)},
                    {"latency_p99_ms", absl::ToDoubleMilliseconds(s.latency_p99)}};
    q["samples"] = SampleCount(static_cast<size_t>(i));
    q["series"] = Series(static_cast<size_t>(i), points);
    return q;
  }

  ConsoleResponse Config() const {
    return Json(200, {{"writes", !token.empty()},
                      {"sample_interval_s", absl::ToDoubleSeconds(options.sample_interval)},
                      {"history_s", absl::ToDoubleSeconds(options.history)},
                      {"driver", std::string(options.driver->name())},
                      {"handlers", options.handlers.size()}});
  }

  ConsoleResponse Queues(const Target& t) const {
    absl::StatusOr<int> points = IntParam(t, "points", 60, 1, kMaxPoints);
    if (!points.ok()) return FromStatus(points.status());
    absl::StatusOr<std::vector<std::string>> names = QueueNames();
    if (!names.ok()) return FromStatus(names.status());
    json list = json::array();
    for (const std::string& n : *names) list.push_back(QueueJson(n, *points, true));
    return Json(200, {{"queues", std::move(list)}});
  }

  ConsoleResponse Queue(const Target& t, const std::string& name) const {
    absl::StatusOr<int> points = IntParam(t, "points", 180, 1, kMaxPoints);
    if (!points.ok()) return FromStatus(points.status());
    if (absl::Status st = KnownQueue(name); !st.ok()) return FromStatus(st);
    json q = QueueJson(name, *points, true);
    q["oldest_ready_age_s"] = OldestReadyAge(name);
    return Json(200, q);
  }

  // Seconds since the message the queue delivers next was published (its envelope's
  // created_at, on the console's clock); null when none is ready, the driver cannot show it
  // (NSQ) or it is no envelope. One PeekReady: asked for one queue's page, never the overview.
  json OldestReadyAge(const std::string& queue) const {
    absl::StatusOr<std::optional<std::string>> next = options.driver->PeekReady(queue);
    if (!next.ok() || !next->has_value()) return nullptr;
    Message m;
    if (!DecodeEnvelope(**next, &m).ok()) return nullptr;
    return std::max(0.0, absl::ToDoubleSeconds(options.clock->Now() - m.created_at));
  }

  ConsoleResponse Health() const { return Json(200, console_internal::HealthJson(options)); }

  // POST /api/queues/Q/pause and /resume: the Handler of Q in this process stops taking
  // deliveries (what it holds goes back to the broker) or takes them again.
  ConsoleResponse PauseOrResume(const std::string& queue, bool pause) const {
    if (absl::Status st = KnownQueue(queue); !st.ok()) return FromStatus(st);
    const int i = HandlerIndex(queue);
    if (i < 0) {
      return Error(409, absl::StrCat("no handler of queue ", queue,
                                     " runs in this process: pause it where it runs"));
    }
    Handler* h = options.handlers[static_cast<size_t>(i)];
    if (pause) {
      h->Pause();
    } else {
      h->Resume();
    }
    return Json(200, {{"queue", queue}, {"state", HandlerState(h->Stats())}});
  }

  // Walks `queue`'s letters of `kinds` after `after_id`, calling `visit(decoded, cursor)` for
  // each match, until it returns false, `max_scan` letters were examined, or the end. Returns
  // the id of the last letter examined (empty at the end), or the store's error.
  template <typename Visit>
  absl::StatusOr<std::string> Walk(DeadLetterStore* store, const std::string& queue,
                                   DeadLetterKinds kinds, std::string after_id,
                                   const LetterFilter& filter, int max_scan, Visit visit) const {
    int scanned = 0;
    while (scanned < max_scan) {
      const int want = std::min(kFetchBatch, max_scan - scanned);
      absl::StatusOr<std::vector<DeadLetter>> batch = store->Fetch(queue, want, after_id, kinds);
      if (!batch.ok()) return batch.status();
      if (batch->empty()) return std::string();
      for (const DeadLetter& l : *batch) {
        const std::string cursor = after_id;
        after_id = l.id;
        ++scanned;
        const Decoded d = Decode(l);
        if (Matches(d, filter) && !visit(d, cursor)) return after_id;
      }
      if (static_cast<int>(batch->size()) < want) return std::string();
    }
    return after_id;
  }

  ConsoleResponse Letters(const Target& t, const std::string& queue) const {
    if (absl::Status st = KnownQueue(queue); !st.ok()) return FromStatus(st);
    DeadLetterStore* store = StoreFor(queue);
    if (store == nullptr) return Error(404, "no dead-letter store for this queue");
    absl::StatusOr<int> limit = IntParam(t, "limit", kDefaultPageLimit, 1, kMaxPageLimit);
    if (!limit.ok()) return FromStatus(limit.status());
    auto kind = t.query.find("kind");
    absl::StatusOr<DeadLetterKinds> kinds =
        ParseKinds(kind == t.query.end() ? "" : absl::string_view(kind->second));
    if (!kinds.ok()) return FromStatus(kinds.status());
    std::string after;
    if (auto tok = t.query.find("page_token"); tok != t.query.end() && !tok->second.empty()) {
      absl::StatusOr<std::string> a = DecodePageToken(tok->second);
      if (!a.ok()) return FromStatus(a.status());
      after = *a;
    }
    LetterFilter filter;
    for (auto [name, field] : {std::pair{"id", &filter.id}, std::pair{"biz_uid", &filter.biz_uid},
                               std::pair{"reason", &filter.reason}}) {
      if (auto it = t.query.find(name); it != t.query.end()) *field = it->second;
    }
    json letters = json::array();
    absl::StatusOr<std::string> last =
        Walk(store, queue, *kinds, after, filter, filter.empty() ? *limit : kMaxScanPerRequest,
             [&](const Decoded& d, const std::string& cursor) {
               letters.push_back(LetterSummary(d, cursor));
               return static_cast<int>(letters.size()) < *limit;
             });
    if (!last.ok()) return FromStatus(last.status());
    absl::StatusOr<int64_t> total = store->Count(queue, *kinds);
    json out = {{"queue", queue},
                {"kinds", KindNames(*kinds)},
                {"letters", std::move(letters)},
                {"next_page_token", last->empty() ? json(nullptr) : json(EncodePageToken(*last))},
                {"total", total.ok() ? json(*total) : json(nullptr)}};
    return Json(200, out);
  }

  ConsoleResponse Letter(const Target& t, const std::string& queue, const std::string& id) const {
    if (absl::Status st = KnownQueue(queue); !st.ok()) return FromStatus(st);
    DeadLetterStore* store = StoreFor(queue);
    if (store == nullptr) return Error(404, "no dead-letter store for this queue");
    std::optional<json> found;
    auto take = [&](const Decoded& d, const std::string&) {
      if (d.letter->id != id) return true;
      found = LetterDetail(d);
      return false;
    };
    LetterFilter none;
    // The list gives each letter the cursor it follows: one fetch finds it from there.
    if (auto a = t.query.find("after"); a != t.query.end()) {
      absl::StatusOr<std::string> r =
          Walk(store, queue, AllDeadLetterKinds(), a->second, none, 1, take);
      if (!r.ok()) return FromStatus(r.status());
    }
    if (!found) {
      absl::StatusOr<std::string> r =
          Walk(store, queue, AllDeadLetterKinds(), "", none, kMaxScanForIds, take);
      if (!r.ok()) return FromStatus(r.status());
    }
    if (!found) return Error(404, absl::StrCat("no dead letter ", id, " in queue ", queue));
    (*found)["queue"] = queue;
    return Json(200, *found);
  }

  absl::StatusOr<json> Body(const ConsoleRequest& req) const {
    if (JsonDepth(req.body) > kMaxJsonDepth) return absl::InvalidArgumentError("body too deep");
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      return absl::InvalidArgumentError("the body must be a JSON object");
    }
    return body;
  }

  ConsoleResponse Replay(const ConsoleRequest& req, const std::string& queue) const {
    if (absl::Status st = KnownQueue(queue); !st.ok()) return FromStatus(st);
    const int i = HandlerIndex(queue);
    if (i < 0) {
      return Error(409,
                   absl::StrCat("no handler of queue ", queue,
                                " runs in this process: replay from the process that runs it"));
    }
    absl::StatusOr<json> body = Body(req);
    if (!body.ok()) return FromStatus(body.status());
    absl::StatusOr<DeadLetterKinds> kinds = KindsFromJson(*body);
    if (!kinds.ok()) return FromStatus(kinds.status());
    ReplayFilter rf;
    rf.kinds = *kinds;
    if (body->contains("ids")) {
      const json& ids = (*body)["ids"];
      if (!ids.is_array() || ids.empty() || ids.size() > static_cast<size_t>(kMaxPageLimit)) {
        return Error(400, absl::StrCat("ids must be an array of 1 to ", kMaxPageLimit, " ids"));
      }
      for (const json& id : ids) {
        if (!id.is_string() || id.get<std::string>().empty()) {
          return Error(400, "ids must hold non-empty strings");
        }
        rf.ids.push_back(id.get<std::string>());
      }
    } else if (body->contains("filter")) {
      absl::StatusOr<LetterFilter> f = FilterFromJson((*body)["filter"]);
      if (!f.ok()) return FromStatus(f.status());
      if (!f->empty()) {
        DeadLetterStore* store = StoreFor(queue);
        absl::StatusOr<std::string> r =
            Walk(store, queue, *kinds, "", *f, kMaxScanForIds, [&](const Decoded& d, auto&) {
              rf.ids.push_back(d.letter->id);
              return true;
            });
        if (!r.ok()) return FromStatus(r.status());
        // ReplayFilter's empty ids mean "any": a filter that matched nothing replays nothing.
        if (rf.ids.empty()) return Json(200, {{"replayed", 0}, {"matched", 0}});
      }
    } else {
      return Error(400, "give ids or a filter");
    }
    const size_t matched = rf.ids.size();
    absl::StatusOr<int> n = options.handlers[static_cast<size_t>(i)]->ReplayDeadLetters(rf);
    if (!n.ok()) return FromStatus(n.status());
    json out = {{"replayed", *n}};
    if (matched > 0) out["matched"] = matched;
    return Json(200, out);
  }

  ConsoleResponse Purge(const ConsoleRequest& req, const std::string& queue) const {
    if (absl::Status st = KnownQueue(queue); !st.ok()) return FromStatus(st);
    DeadLetterStore* store = StoreFor(queue);
    if (store == nullptr) return Error(404, "no dead-letter store for this queue");
    absl::StatusOr<json> body = Body(req);
    if (!body.ok()) return FromStatus(body.status());
    absl::StatusOr<DeadLetterKinds> kinds = KindsFromJson(*body);
    if (!kinds.ok()) return FromStatus(kinds.status());
    if (!body->contains("count") || !(*body)["count"].is_number_integer()) {
      return Error(400, "count must be the number of letters the user was shown");
    }
    const int64_t expected = (*body)["count"].get<int64_t>();
    absl::StatusOr<int64_t> actual = store->Count(queue, *kinds);
    if (!actual.ok()) return FromStatus(actual.status());
    if (*actual != expected) {
      return Json(409, {{"error", absl::StrCat("the queue holds ", *actual, " such letters, not ",
                                               expected, ": look again before purging")},
                        {"count", *actual}});
    }
    if (absl::Status st = store->Purge(queue, *kinds); !st.ok()) return FromStatus(st);
    return Json(200, {{"purged", *actual}});
  }

  // nullopt when `req` may write; else the refusal.
  std::optional<ConsoleResponse> RefuseWrite(const ConsoleRequest& req) const {
    if (token.empty()) {
      return Error(403, "read-only console: no write token is configured");
    }
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(req.authorization, kBearer) ||
        !ConstantTimeEquals(absl::string_view(req.authorization).substr(kBearer.size()), token)) {
      ConsoleResponse r = Error(401, "writes need Authorization: Bearer <write token>");
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      return r;
    }
    return std::nullopt;
  }

  ConsoleResponse Route(const ConsoleRequest& req) const {
    const Target t = ParseTarget(req.target);
    const std::vector<std::string>& s = t.segments;
    const bool get = req.method == "GET";
    const bool post = req.method == "POST";
    auto only = [](absl::string_view allow) {
      ConsoleResponse r = Error(405, absl::StrCat("method not allowed; allowed: ", allow));
      r.headers.emplace_back("Allow", std::string(allow));
      return r;
    };
    if (s[0] == "ui") {
      if (!get) return only("GET");
      if (s.size() == 1) return Asset("index.html");
      if (s.size() == 2) return Asset(s[1]);
      return Error(404, "not found");
    }
    // /api/...
    if (s.size() == 2 && s[1] == "config") return get ? Config() : only("GET");
    if (s.size() == 2 && s[1] == "health") return get ? Health() : only("GET");
    if (s.size() == 2 && s[1] == "queues") return get ? Queues(t) : only("GET");
    if (s.size() >= 3 && s[1] == "queues") {
      const std::string& q = s[2];
      if (s.size() == 3) return get ? Queue(t, q) : only("GET");
      if (s.size() == 4 && (s[3] == "pause" || s[3] == "resume")) {
        if (!post) return only("POST");
        if (std::optional<ConsoleResponse> refused = RefuseWrite(req)) return *refused;
        return PauseOrResume(q, s[3] == "pause");
      }
      if (s[3] == "dead-letters") {
        if (s.size() == 4) return get ? Letters(t, q) : only("GET");
        if (s.size() == 5 && (s[4] == "replay" || s[4] == "purge")) {
          if (!post) return only("POST");
          if (std::optional<ConsoleResponse> refused = RefuseWrite(req)) return *refused;
          return s[4] == "replay" ? Replay(req, q) : Purge(req, q);
        }
        if (s.size() == 5) return get ? Letter(t, q, s[4]) : only("GET");
      }
    }
    return Error(404, "no such endpoint (docs/console.md lists them)");
  }
};

Console::Console(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Console::~Console() = default;

absl::StatusOr<std::unique_ptr<Console>> Console::Create(ConsoleOptions options) {
  auto invalid = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("ConsoleOptions.", field, ": ", what));
  };
  for (Handler* h : options.handlers) {
    if (h == nullptr) return invalid("handlers", "null handler");
  }
  if (options.driver == nullptr && !options.handlers.empty()) {
    options.driver = options.handlers[0]->options().driver;
  }
  if (options.driver == nullptr) return invalid("driver", "required without handlers");
  if (options.dead_letters == nullptr && !options.handlers.empty()) {
    options.dead_letters = options.handlers[0]->options().stores.dead_letters;
  }
  if (options.sample_interval <= absl::ZeroDuration()) {
    return invalid("sample_interval", "must be > 0");
  }
  if (options.history < options.sample_interval) {
    return invalid("history", "must be >= sample_interval");
  }
  if (options.ping_timeout <= absl::ZeroDuration()) return invalid("ping_timeout", "must be > 0");
  if (options.clock == nullptr) options.clock = RealClock();
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->token = impl->options.write_token;
  if (impl->token.empty()) {
    if (const char* env = std::getenv(kConsoleWriteTokenEnv)) impl->token = env;
  }
  impl->sampler.Start();
  return std::unique_ptr<Console>(new Console(std::move(impl)));
}

bool Console::Serves(absl::string_view path) {
  if (size_t q = path.find('?'); q != absl::string_view::npos) path = path.substr(0, q);
  return path == "/api" || absl::StartsWith(path, "/api/") || path == "/ui" ||
         absl::StartsWith(path, "/ui/");
}

bool Console::writable() const { return !impl_->token.empty(); }

ConsoleResponse Console::Serve(const ConsoleRequest& request) {
  ConsoleResponse r = Serves(request.target)
                          ? impl_->Route(request)
                          : Error(404, "no such endpoint (docs/console.md lists them)");
  r.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Referrer-Policy", "no-referrer");
  r.headers.emplace_back("X-Frame-Options", "DENY");
  return r;
}

}  // namespace bus
