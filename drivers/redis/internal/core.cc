#include "drivers/redis/internal/core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bus/backoff.h"
#include "bus/logger.h"
#include "drivers/redis/internal/queue_scripts.h"

namespace bus::redis {

const Script& EnqueueScript() {
  static const Script* s = new Script(redis_scripts::kEnqueue);
  return *s;
}
const Script& ReserveScript() {
  static const Script* s = new Script(redis_scripts::kReserve);
  return *s;
}
const Script& AckScript() {
  static const Script* s = new Script(redis_scripts::kAck);
  return *s;
}
const Script& AckManyScript() {
  static const Script* s = new Script(redis_scripts::kAckMany);
  return *s;
}
const Script& NackScript() {
  static const Script* s = new Script(redis_scripts::kNack);
  return *s;
}
const Script& InspectScript() {
  static const Script* s = new Script(redis_scripts::kInspect);
  return *s;
}
const Script& PeekReadyScript() {
  static const Script* s = new Script(redis_scripts::kPeekReady);
  return *s;
}
const Script& DeleteQueueScript() {
  static const Script* s = new Script(redis_scripts::kDeleteQueue);
  return *s;
}
const Script& ExtendScript() {
  static const Script* s = new Script(redis_scripts::kExtend);
  return *s;
}

QueueKeys::QueueKeys(absl::string_view prefix, absl::string_view queue) {
  const std::string base = absl::StrCat(prefix, "q:{", queue, "}:");
  ready = base + "ready";
  delayed = base + "delayed";
  inflight = base + "inflight";
  msgs = base + "msgs";
  attempts = base + "attempts";
  meta = base + "meta";
  notify = base + "notify";
  seen = base + "seen";
}

std::string TopicKey(absl::string_view prefix, absl::string_view topic) {
  return absl::StrCat(prefix, "t:{", topic, "}:bindings");
}

std::string QueuesKey(absl::string_view prefix) { return absl::StrCat(prefix, "queues"); }

std::string QueuesScannedKey(absl::string_view prefix) {
  return absl::StrCat(prefix, "queues:scanned");
}

int64_t Millis(absl::Duration d) {
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))));
}

absl::StatusOr<int64_t> IntReply(const Reply& r) {
  if (r.is_error()) return ReplyStatus(r);
  if (r.type != Reply::Type::kInteger) return absl::InternalError("redis: unexpected reply type");
  return r.integer;
}

Core::Core(RedisOptions options)
    : options_(std::move(options)),
      client_(NewClient(
          options_, [this](const std::string& address) { LogReconnect(address); },
          "redis driver")) {}

void Core::LogReconnect(const std::string& address) {
  const uint64_t n = reconnects_.fetch_add(1, std::memory_order_relaxed) + 1;
  // The record's fields are views: the text must outlive Write.
  const std::string text = absl::StrCat("reconnected to ", address, " (reconnects: ", n, ")");
  LogRecord r;
  r.level = LogLevel::kWarning;
  r.time = options_.clock->Now();
  r.component = "redis";
  r.event = "reconnected";
  r.text = text;
  options_.logger->Write(r);
}

std::string Core::NewMessageId() {
  absl::MutexLock lock(&id_mu_);
  return absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(id_gen_), absl::kZeroPad16),
                      absl::Hex(absl::Uniform<uint64_t>(id_gen_), absl::kZeroPad16));
}

absl::Status Core::EnqueueOnce(std::vector<std::vector<std::string>> calls,
                               absl::Duration timeout) {
  // Replicated: with wait_replicas set, a send is acknowledged only once replicas have it.
  absl::StatusOr<std::vector<Reply>> replies =
      client_->Eval(EnqueueScript(), std::move(calls), timeout, Durability::kReplicated);
  if (!replies.ok()) return replies.status();
  for (const Reply& r : *replies) {
    if (absl::StatusOr<int64_t> n = IntReply(r); !n.ok()) return n.status();
  }
  return absl::OkStatus();
}

absl::Status Core::Enqueue(std::vector<std::vector<std::string>> calls) {
  const Clock& clock = *options_.clock;
  const absl::Time deadline = clock.Now() + options_.timeouts.request;
  Backoff backoff(options_.backoff, options_.random);
  while (true) {
    absl::Status st = EnqueueOnce(calls, deadline - clock.Now());
    if (!absl::IsUnavailable(st)) return st;
    const absl::Time resume = clock.Now() + backoff.Next();
    if (resume >= deadline) return st;
    SleepUntil(clock, resume);
  }
}

}  // namespace bus::redis
