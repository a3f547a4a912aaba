#include "drivers/rabbitmq/internal/topology.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "drivers/rabbitmq/internal/delays.h"

namespace bus::rabbitmq {
namespace {

amqp_table_entry_t StringEntry(const char* key, absl::string_view value) {
  amqp_table_entry_t e{};
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_UTF8;
  e.value.value.bytes = Bytes(value);
  return e;
}

amqp_table_entry_t IntEntry(const char* key, int64_t value) {
  amqp_table_entry_t e{};
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_I64;
  e.value.value.i64 = value;
  return e;
}

absl::Status Declare(Link& link, absl::string_view queue, std::vector<amqp_table_entry_t> args) {
  amqp_queue_declare(link.state(), kAdminChannel, Bytes(queue), 0, 1, 0, 0,
                     amqp_table_t{static_cast<int>(args.size()), args.data()});
  return link.Check(kAdminChannel, absl::StrCat("declare queue '", queue, "'"));
}

// Passive declares PeekFirst makes at most while waiting for its reject to apply.
constexpr int kPeekPolls = 200;

std::string AmqpBindingKey(absl::string_view binding_key) {
  return binding_key.empty() ? std::string("#") : std::string(binding_key);
}

}  // namespace

absl::Status DeclareQueue(Link& link, absl::string_view queue, const RabbitMqOptions::Queues& q) {
  const bool quorum = q.type == RabbitMqOptions::Queues::Type::kQuorum;
  std::vector<amqp_table_entry_t> args = {
      StringEntry("x-queue-type", quorum ? "quorum" : "classic")};
  if (quorum && q.delivery_limit > 0)
    args.push_back(IntEntry("x-delivery-limit", q.delivery_limit));
  return Declare(link, queue, std::move(args));
}

absl::Status DeclareWaitQueue(Link& link, absl::string_view queue, int64_t step_ms) {
  return Declare(
      link, WaitQueueName(queue, step_ms),
      {StringEntry("x-queue-type", "classic"), IntEntry("x-message-ttl", step_ms),
       StringEntry("x-dead-letter-exchange", ""), StringEntry("x-dead-letter-routing-key", queue)});
}

absl::Status DeclareExchange(Link& link, absl::string_view topic) {
  amqp_exchange_declare(link.state(), kAdminChannel, Bytes(topic), amqp_cstring_bytes("topic"), 0,
                        1, 0, 0, amqp_empty_table);
  return link.Check(kAdminChannel, absl::StrCat("declare topic exchange '", topic, "'"));
}

absl::Status Bind(Link& link, absl::string_view topic, absl::string_view queue,
                  absl::string_view binding_key) {
  const std::string key = AmqpBindingKey(binding_key);
  amqp_queue_bind(link.state(), kAdminChannel, Bytes(queue), Bytes(topic), Bytes(key),
                  amqp_empty_table);
  return link.Check(kAdminChannel, absl::StrCat("bind queue '", queue, "' to '", topic, "'"));
}

absl::Status Unbind(Link& link, absl::string_view topic, absl::string_view queue,
                    absl::string_view binding_key) {
  const std::string key = AmqpBindingKey(binding_key);
  amqp_queue_unbind(link.state(), kAdminChannel, Bytes(queue), Bytes(topic), Bytes(key),
                    amqp_empty_table);
  absl::Status st =
      link.Check(kAdminChannel, absl::StrCat("unbind queue '", queue, "' from '", topic, "'"));
  return absl::IsNotFound(st) ? absl::OkStatus() : st;
}

absl::Status DeleteQueueAndWaits(Link& link, absl::string_view queue) {
  std::vector<std::string> names = {std::string(queue)};
  for (int64_t step : DelayLadder()) names.push_back(WaitQueueName(queue, step));
  for (const std::string& name : names) {
    amqp_queue_delete(link.state(), kAdminChannel, Bytes(name), 0, 0);
    absl::Status st = link.Check(kAdminChannel, absl::StrCat("delete queue '", name, "'"));
    if (!st.ok() && !absl::IsNotFound(st)) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> ReadyCount(Link& link, absl::string_view queue) {
  amqp_queue_declare_ok_t* ok =
      amqp_queue_declare(link.state(), kAdminChannel, Bytes(queue), 1, 0, 0, 0, amqp_empty_table);
  absl::Status st = link.Check(kAdminChannel, absl::StrCat("inspect queue '", queue, "'"));
  if (absl::IsNotFound(st)) return std::optional<int64_t>();
  if (!st.ok()) return st;
  return std::optional<int64_t>(ok->message_count);
}

absl::StatusOr<std::optional<std::string>> PeekFirst(Link& link, absl::string_view queue) {
  absl::StatusOr<std::optional<int64_t>> before = ReadyCount(link, queue);
  if (!before.ok()) return before.status();
  if (!before->has_value() || **before == 0) return std::optional<std::string>();
  // basic.get on a channel of its own, closed afterwards: the broker takes the message back.
  if (absl::Status st = link.OpenPeekChannel(); !st.ok()) return st;
  amqp_basic_get(link.state(), kPeekChannel, Bytes(queue), 0);
  absl::Status st = link.Check(kPeekChannel, absl::StrCat("peek into queue '", queue, "'"));
  std::optional<std::string> body;
  amqp_rpc_reply_t r = amqp_get_rpc_reply(link.state());
  if (st.ok() && r.reply.id == AMQP_BASIC_GET_OK_METHOD) {
    amqp_message_t msg;
    amqp_rpc_reply_t read = amqp_read_message(link.state(), kPeekChannel, &msg, 0);
    if (read.reply_type != AMQP_RESPONSE_NORMAL) {
      link.Break(absl::UnavailableError("RabbitMQ: a peeked message was cut short"));
      return link.broken_status();
    }
    body = String(msg.body);
    amqp_destroy_message(&msg);
  }
  if (absl::Status closed = link.ClosePeekChannel(); !closed.ok()) return closed;
  if (absl::IsNotFound(st)) return std::optional<std::string>();
  if (!st.ok()) return st;
  // The broker re-enqueues the message after the close; wait (bounded) until it is back among
  // the ready ones, so that the next call sees it.
  for (int i = 0; body.has_value() && i < kPeekPolls; ++i) {
    absl::StatusOr<std::optional<int64_t>> now = ReadyCount(link, queue);
    if (!now.ok()) return now.status();
    if (now->value_or(0) >= **before) break;
  }
  return body;
}

}  // namespace bus::rabbitmq
