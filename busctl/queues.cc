// busctl queues and stats QUEUE: ready, delayed and in-flight counts and, with --stores, dead
// letters by kind.

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "busctl/commands.h"
#include "busctl/output.h"

namespace busctl {
namespace {

absl::Status PrintQueues(const Invocation& in, const std::vector<std::string>& queues,
                         bus::Driver& driver) {
  std::shared_ptr<bus::DeadLetterStore> dl;
  if (!in.stores_url.empty()) {
    absl::StatusOr<std::shared_ptr<bus::DeadLetterStore>> s = in.DeadLetters();
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
      for (bus::DeadLetterKind k : bus::kDeadLetterKinds) {
        absl::StatusOr<int64_t> n = dl->Count(q, bus::DeadLetterKinds{k});
        if (!n.ok()) return n.status();
        dead[std::string(bus::DeadLetterKindName(k))] = *n;
        row.push_back(absl::StrCat(*n));
      }
      j["dead_letters"] = dead;
    }
    if (JsonOutput()) {
      PrintJson(j);
    } else {
      rows.push_back(std::move(row));
    }
  }
  if (!JsonOutput()) {
    std::vector<std::string> header = {"QUEUE", "READY", "DELAYED", "IN_FLIGHT"};
    if (dl != nullptr) {
      for (bus::DeadLetterKind k : bus::kDeadLetterKinds) {
        header.push_back(absl::AsciiStrToUpper(bus::DeadLetterKindName(k)));
      }
    }
    PrintTable(header, rows);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunQueues(const Invocation& in) {
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = in.Driver();
  if (!driver.ok()) return driver.status();
  absl::StatusOr<std::vector<std::string>> queues = (*driver)->ListQueues();
  if (!queues.ok()) return queues.status();
  return PrintQueues(in, *queues, **driver);
}

absl::Status RunStats(const Invocation& in) {
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = in.Driver();
  if (!driver.ok()) return driver.status();
  return PrintQueues(in, {in.args[0]}, **driver);
}

}  // namespace busctl
