#include "drivers/nats/nats_driver.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "drivers/nats/internal/client.h"
#include "drivers/nats/internal/consumer.h"
#include "drivers/nats/internal/core.h"

namespace bus {
namespace {

using nats::Client;
using nats::Core;
using nats::QueueState;
using nats::Subjects;
using nlohmann::json;

using Headers = std::vector<std::pair<std::string, std::string>>;

// A Nats-Msg-Id: unique per send, so the stream drops only a retried publish of the same send.
std::string NewMessageId() {
  thread_local absl::BitGen gen;
  return absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16),
                      absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
}

class NatsDriver final : public Driver {
 public:
  explicit NatsDriver(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  absl::string_view name() const override { return "nats"; }
  std::shared_ptr<Clock> clock() const override { return core_->shared_clock(); }

  DriverStats Stats() const override {
    return {.reconnects = core_->client().reconnects(),
            .connections = natsConnection_IsClosed(core_->client().conn()) ? 0 : 1};
  }

  absl::Status Ping(absl::Duration timeout) override {
    natsStatus s = natsConnection_FlushTimeout(core_->client().conn(), nats::Millis(timeout));
    if (s == NATS_TIMEOUT) return absl::DeadlineExceededError("NATS did not answer PING in time");
    return nats::FromNats(s, "PING");
  }

  absl::StatusOr<std::vector<std::string>> ListQueues() override;

 private:
  absl::Status DoCreateQueue(absl::string_view queue, absl::Duration delay) override;
  absl::Status DoSubscribe(absl::string_view topic, absl::string_view queue,
                           absl::string_view binding_key) override;
  absl::Status DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                             absl::string_view binding_key) override;
  absl::Status DoDeleteQueue(absl::string_view queue) override;
  absl::Status DoSendToQueue(absl::string_view queue, absl::string_view data,
                             absl::Duration delay) override;
  absl::Status DoSendBatchToQueue(absl::string_view queue, absl::Span<const std::string> data,
                                  absl::Duration delay) override;
  absl::Status DoSendToTopic(absl::string_view topic, absl::string_view data,
                             absl::string_view route_key) override;
  absl::StatusOr<std::unique_ptr<Consumer>> DoNewConsumer(absl::string_view queue,
                                                          const ConsumerOptions& options) override {
    return nats::NatsConsumer::Open(core_, std::string(queue), options);
  }
  absl::StatusOr<QueueCounts> DoInspectQueue(absl::string_view queue) override;
  absl::StatusOr<std::optional<std::string>> DoPeekReady(absl::string_view queue) override;

  // The subject and headers of one message for `queue`, delayed by `delay` in all.
  Client::Outgoing Outgoing(const std::string& queue, absl::string_view data,
                            absl::Duration delay) const;
  // Reads the queue's consumer (made if absent), lets `change` edit it, writes it back when
  // `change` says it changed.
  absl::Status Update(const std::string& queue, const std::function<bool(QueueState&)>& change,
                      bool create);

  std::shared_ptr<Core> core_;
};

Client::Outgoing NatsDriver::Outgoing(const std::string& queue, absl::string_view data,
                                      absl::Duration delay) const {
  const std::string id = NewMessageId();
  Client::Outgoing out{core_->subjects().Queue(queue), data, {{"Nats-Msg-Id", id}}};
  if (delay > absl::ZeroDuration()) {
    // A JetStream message schedule: the server stores it on a subject of its own and publishes
    // it to the queue's subject when it falls due, on the server's clock.
    const absl::Time due = absl::Now() + delay;
    out.headers.emplace_back(
        "Nats-Schedule",
        absl::StrCat("@at ", absl::FormatTime("%Y-%m-%dT%H:%M:%E*SZ", due, absl::UTCTimeZone())));
    out.headers.emplace_back("Nats-Schedule-Target", out.subject);
    out.subject = core_->subjects().Delayed(queue, id);
  }
  return out;
}

absl::Status NatsDriver::Update(const std::string& queue,
                                const std::function<bool(QueueState&)>& change, bool create) {
  absl::StatusOr<QueueState> state = core_->ReadQueue(queue);
  if (absl::IsNotFound(state.status())) {
    if (!create) return absl::OkStatus();
    state = QueueState{};
    if (!change(*state)) return core_->WriteQueue(queue, *state);
  } else if (!state.ok()) {
    return state.status();
  } else if (!change(*state)) {
    core_->Remember(queue, state->delay);
    return absl::OkStatus();
  }
  return core_->WriteQueue(queue, *state);
}

absl::Status NatsDriver::DoCreateQueue(absl::string_view queue, absl::Duration delay) {
  if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("create queue: delay < 0");
  return Update(
      std::string(queue),
      [&](QueueState& s) {
        if (s.delay == delay) return false;
        s.delay = delay;
        return true;
      },
      /*create=*/true);
}

absl::Status NatsDriver::DoSubscribe(absl::string_view topic, absl::string_view queue,
                                     absl::string_view binding_key) {
  return Update(
      std::string(queue),
      [&](QueueState& s) {
        return s.bindings.emplace(std::string(topic), std::string(binding_key)).second;
      },
      /*create=*/true);
}

absl::Status NatsDriver::DoUnsubscribe(absl::string_view topic, absl::string_view queue,
                                       absl::string_view binding_key) {
  return Update(
      std::string(queue),
      [&](QueueState& s) {
        return s.bindings.erase({std::string(topic), std::string(binding_key)}) > 0;
      },
      /*create=*/false);
}

absl::Status NatsDriver::DoDeleteQueue(absl::string_view queue) {
  const std::string q(queue);
  const std::string& stream = core_->options().stream.name;
  core_->Forget(q);
  absl::StatusOr<json> deleted = core_->client().Api(
      absl::StrCat("CONSUMER.DELETE.", stream, ".", Subjects::ConsumerName(q)), json());
  if (!deleted.ok() && !absl::IsNotFound(deleted.status())) return deleted.status();
  for (const std::string& filter : {core_->subjects().Queue(q), core_->subjects().DelayedOf(q)}) {
    absl::StatusOr<json> purged =
        core_->client().Api(absl::StrCat("STREAM.PURGE.", stream), json{{"filter", filter}});
    if (!purged.ok()) return purged.status();
  }
  return absl::OkStatus();
}

absl::Status NatsDriver::DoSendToQueue(absl::string_view queue, absl::string_view data,
                                       absl::Duration delay) {
  if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("send: delay < 0");
  const std::string q(queue);
  absl::StatusOr<absl::Duration> queue_delay = core_->EnsureQueue(q);
  if (!queue_delay.ok()) return queue_delay.status();
  Client::Outgoing out = Outgoing(q, data, *queue_delay + delay);
  return core_->client().Publish(out.subject, out.data, out.headers);
}

absl::Status NatsDriver::DoSendBatchToQueue(absl::string_view queue,
                                            absl::Span<const std::string> data,
                                            absl::Duration delay) {
  if (delay < absl::ZeroDuration()) return absl::InvalidArgumentError("send: delay < 0");
  const std::string q(queue);
  absl::StatusOr<absl::Duration> queue_delay = core_->EnsureQueue(q);
  if (!queue_delay.ok()) return queue_delay.status();
  // Bounded batches: every acknowledgement of one batch is awaited before the next is sent.
  constexpr size_t kBatch = 1000;
  for (size_t i = 0; i < data.size(); i += kBatch) {
    std::vector<Client::Outgoing> batch;
    for (size_t j = i; j < std::min(data.size(), i + kBatch); ++j) {
      batch.push_back(Outgoing(q, data[j], *queue_delay + delay));
    }
    if (absl::Status st = core_->client().PublishMany(batch); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status NatsDriver::DoSendToTopic(absl::string_view topic, absl::string_view data,
                                       absl::string_view route_key) {
  const std::string subject = core_->subjects().Topic(topic, route_key);
  return core_->client().Publish(subject, data, {{"Nats-Msg-Id", NewMessageId()}});
}

absl::StatusOr<std::vector<std::string>> NatsDriver::ListQueues() {
  std::vector<std::string> out;
  for (int64_t offset = 0;;) {
    absl::StatusOr<json> page = core_->client().Api(
        absl::StrCat("CONSUMER.NAMES.", core_->options().stream.name), json{{"offset", offset}});
    if (!page.ok()) return page.status();
    const json names = page->value("consumers", json::array());
    for (const json& name : names) {
      if (!name.is_string()) continue;
      if (std::optional<std::string> q = Subjects::QueueOfConsumer(name.get<std::string>())) {
        out.push_back(*std::move(q));
      }
    }
    offset += static_cast<int64_t>(names.size());
    if (names.empty() || offset >= page->value("total", int64_t{0})) break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<QueueCounts> NatsDriver::DoInspectQueue(absl::string_view queue) {
  const std::string q(queue);
  QueueCounts counts{.queue = q};
  absl::StatusOr<QueueState> state = core_->ReadQueue(q);
  if (absl::IsNotFound(state.status())) return counts;
  if (!state.ok()) return state.status();
  counts.ready = state->num_pending;
  counts.in_flight = state->num_ack_pending;
  // The delayed messages are schedules, one subject each.
  absl::StatusOr<json> info =
      core_->client().Api(absl::StrCat("STREAM.INFO.", core_->options().stream.name),
                          json{{"subjects_filter", core_->subjects().DelayedOf(q)}});
  if (!info.ok()) return info.status();
  const json subjects = (*info)["state"].value("subjects", json::object());
  for (const auto& entry : subjects.items()) counts.delayed += entry.value().get<int64_t>();
  return counts;
}

absl::StatusOr<std::optional<std::string>> NatsDriver::DoPeekReady(absl::string_view queue) {
  const std::string q(queue);
  absl::StatusOr<QueueState> state = core_->ReadQueue(q);
  if (absl::IsNotFound(state.status())) return std::nullopt;
  if (!state.ok()) return state.status();
  // The first stored message past the consumer's delivered point on any of its filters.
  std::optional<std::pair<uint64_t, std::string>> first;
  for (const std::string& filter : core_->Filters(q, *state)) {
    absl::StatusOr<json> got = core_->client().Api(
        absl::StrCat("STREAM.MSG.GET.", core_->options().stream.name),
        json{{"seq", state->delivered_stream_seq + 1}, {"next_by_subj", filter}});
    if (absl::IsNotFound(got.status())) continue;
    if (!got.ok()) return got.status();
    const json& message = (*got)["message"];
    const uint64_t seq = message.value("seq", uint64_t{0});
    if (first && first->first <= seq) continue;
    std::string data;
    absl::Base64Unescape(message.value("data", std::string()), &data);
    first.emplace(seq, std::move(data));
  }
  if (!first) return std::nullopt;
  return std::optional<std::string>(std::move(first->second));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> NewNatsDriver(NatsOptions options) {
  if (absl::Status st = ValidateNatsOptions(options); !st.ok()) return st;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return client.status();
  auto core = std::make_shared<Core>(*std::move(client), std::move(options));
  if (absl::Status st = core->EnsureStream(); !st.ok()) return st;
  return std::shared_ptr<Driver>(std::make_shared<NatsDriver>(std::move(core)));
}

}  // namespace bus
