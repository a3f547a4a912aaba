// busctl dead-letters list|show|replay|purge|count: a queue's dead letters.

#include <algorithm>
#include <iostream>
#include <set>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bus/envelope.h"
#include "busctl/commands.h"
#include "busctl/output.h"

namespace busctl {
namespace {

// Letters are read from the store in batches of this many.
constexpr int kBatch = 500;

// The replay count travels in this header, as the Handler's replay sets it.
constexpr char kReplaysHeader[] = "bus-replays";

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

// The letter `id` of `queue`, walking the queue in batches; NotFound when absent.
absl::StatusOr<bus::DeadLetter> FindLetter(bus::DeadLetterStore& dl, const std::string& queue,
                                           const std::string& id) {
  std::string after;
  for (;;) {
    absl::StatusOr<std::vector<bus::DeadLetter>> batch = dl.Fetch(queue, kBatch, after);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    for (bus::DeadLetter& l : *batch) {
      if (l.id == id) return std::move(l);
    }
    after = batch->back().id;
  }
  return absl::NotFoundError(absl::StrCat("dead letter ", id, " not found in queue ", queue));
}

void PrintLetter(const Json& j) {
  if (JsonOutput()) {
    PrintJson(j);
    return;
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
}

}  // namespace

std::optional<UsageError> CheckDeadList(const Invocation&) {
  if (const int limit = absl::GetFlag(FLAGS_limit); limit < 1) {
    return UsageError{absl::StrCat("--limit=", limit, ": want at least 1")};
  }
  return std::nullopt;
}

absl::Status RunDeadList(const Invocation& in) {
  const std::string& queue = in.args[0];
  const bus::DeadLetterKinds kinds = absl::GetFlag(FLAGS_kind).Kinds();
  const int limit = absl::GetFlag(FLAGS_limit);
  const absl::Time since = absl::GetFlag(FLAGS_since).at;
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = in.DeadLetters();
  if (!dl.ok()) return dl.status();
  std::vector<std::vector<std::string>> rows;
  std::string after;
  int shown = 0;
  while (shown < limit) {
    absl::StatusOr<std::vector<bus::DeadLetter>> batch = (*dl)->Fetch(queue, kBatch, after, kinds);
    if (!batch.ok()) return batch.status();
    if (batch->empty()) break;
    after = batch->back().id;
    for (const bus::DeadLetter& l : *batch) {
      if (l.last_failed_at < since) continue;
      if (shown++ >= limit) break;
      if (JsonOutput()) {
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
  if (!JsonOutput()) PrintTable({"ID", "KIND", "ATTEMPTS", "LAST_FAILED", "REASON"}, rows);
  return absl::OkStatus();
}

std::optional<UsageError> CheckDeadShow(const Invocation& in) {
  if (in.args.size() == 1 && in.driver_url.empty()) {
    return UsageError{"show without QUEUE lists the queues: give --driver=URL (or set BUS_DRIVER)"};
  }
  return std::nullopt;
}

absl::Status RunDeadShow(const Invocation& in) {
  const std::string& id = in.args.back();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = in.DeadLetters();
  if (!dl.ok()) return dl.status();
  std::vector<std::string> queues;
  if (in.args.size() == 2) {
    queues.push_back(in.args[0]);
  } else {
    absl::StatusOr<std::shared_ptr<bus::Driver>> driver = in.Driver();
    if (!driver.ok()) return driver.status();
    absl::StatusOr<std::vector<std::string>> all = (*driver)->ListQueues();
    if (!all.ok()) return all.status();
    queues = *all;
  }
  for (const std::string& q : queues) {
    absl::StatusOr<bus::DeadLetter> l = FindLetter(**dl, q, id);
    if (absl::IsNotFound(l.status())) continue;
    if (!l.ok()) return l.status();
    PrintLetter(LetterJson(*l, true));
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("dead letter ", id, " not found"));
}

std::optional<UsageError> CheckDeadReplay(const Invocation& in) {
  const int selectors = int{in.Given("id")} + int{in.Given("kind")} + int{in.Given("all")};
  if (selectors != 1 || (in.Given("all") && !absl::GetFlag(FLAGS_all))) {
    return UsageError{"replay: give exactly one of --id, --kind or --all"};
  }
  return std::nullopt;
}

absl::Status RunDeadReplay(const Invocation& in) {
  const std::string& queue = in.args[0];
  const std::vector<std::string> ids = absl::GetFlag(FLAGS_id);
  const bus::DeadLetterKinds kinds = absl::GetFlag(FLAGS_kind).Kinds();
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = in.Driver();
  if (!driver.ok()) return driver.status();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = in.DeadLetters();
  if (!dl.ok()) return dl.status();
  std::set<std::string> wanted(ids.begin(), ids.end());
  Progress progress("replayed");
  std::string after;
  for (;;) {
    absl::StatusOr<std::vector<bus::DeadLetter>> batch = (*dl)->Fetch(queue, kBatch, after, kinds);
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
  if (JsonOutput()) {
    PrintJson({{"queue", queue}, {"replayed", n}});
  } else {
    std::cout << "replayed " << n << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunDeadPurge(const Invocation& in) {
  const std::string& queue = in.args[0];
  if (!absl::GetFlag(FLAGS_yes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("purge deletes dead letters of ", queue, " for good; add --yes"));
  }
  const bus::DeadLetterKinds kinds = absl::GetFlag(FLAGS_kind).Kinds();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = in.DeadLetters();
  if (!dl.ok()) return dl.status();
  absl::StatusOr<int64_t> before = (*dl)->Count(queue, kinds);
  if (!before.ok()) return before.status();
  {
    Progress progress("purging");
    if (absl::Status st = (*dl)->Purge(queue, kinds); !st.ok()) return st;
  }
  absl::StatusOr<int64_t> left = (*dl)->Count(queue, kinds);
  if (!left.ok()) return left.status();
  const int64_t purged = std::max<int64_t>(0, *before - *left);
  if (JsonOutput()) {
    PrintJson({{"queue", queue}, {"purged", purged}});
  } else {
    std::cout << "purged " << purged << "\n";
  }
  return absl::OkStatus();
}

// Every kind, or with --kind only that one: a kind left out is not shown (not shown as 0).
absl::Status RunDeadCount(const Invocation& in) {
  const std::string& queue = in.args[0];
  const bus::DeadLetterKinds kinds = absl::GetFlag(FLAGS_kind).Kinds();
  absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> dl = in.DeadLetters();
  if (!dl.ok()) return dl.status();
  Json j = {{"queue", queue}};
  std::vector<std::string> header = {"QUEUE"};
  std::vector<std::string> row = {queue};
  int64_t total = 0;
  for (bus::DeadLetterKind k : bus::kDeadLetterKinds) {
    if (!kinds.Contains(k)) continue;
    absl::StatusOr<int64_t> n = (*dl)->Count(queue, bus::DeadLetterKinds{k});
    if (!n.ok()) return n.status();
    const std::string name(bus::DeadLetterKindName(k));
    j[name] = *n;
    header.push_back(absl::AsciiStrToUpper(name));
    row.push_back(absl::StrCat(*n));
    total += *n;
  }
  j["total"] = total;
  header.push_back("TOTAL");
  row.push_back(absl::StrCat(total));
  if (JsonOutput()) {
    PrintJson(j);
  } else {
    PrintTable(header, {row});
  }
  return absl::OkStatus();
}

}  // namespace busctl
