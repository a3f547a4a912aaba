// The RabbitMQ driver's own cases beyond the conformance suite, against one broker the test
// binary starts: bad input (credentials, vhost, an exchange of another type, a queue of other
// arguments, frame sizes, a channel the broker closes mid-batch), a consumer the broker cancels,
// and a connection the broker blocks.

#include "drivers/rabbitmq/rabbitmq_driver.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/rabbitmq_server.h"
#include "tests/testing/wait.h"

namespace bus::testing {
namespace {

// The largest message the broker takes (max_message_size), so that a test can make it close a
// channel.
constexpr int kBrokerMaxMessage = 256 * 1024;

RabbitMqServer* Broker() {
  static const std::unique_ptr<RabbitMqServer> broker = [] {
    absl::StatusOr<std::unique_ptr<RabbitMqServer>> b = RabbitMqServer::Start(
        {.config_lines = {absl::StrCat("max_message_size = ", kBrokerMaxMessage)}});
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }();
  return broker.get();
}

RabbitMqOptions Options() {
  RabbitMqOptions o;
  o.port = Broker() != nullptr ? Broker()->port() : 1;
  o.timeouts.request = absl::Seconds(5);
  return o;
}

std::shared_ptr<Driver> Open(RabbitMqOptions o = Options()) {
  absl::StatusOr<std::shared_ptr<Driver>> d = NewRabbitMqDriver(std::move(o));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : nullptr;
}

std::vector<Delivery> ReceiveN(Consumer* c, size_t n) {
  std::vector<Delivery> out;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (out.size() < n && absl::Now() < deadline) {
    EXPECT_TRUE(
        c->Receive(static_cast<int>(n - out.size()), absl::Milliseconds(200), {}, &out).ok());
  }
  return out;
}

// Declares an exchange of `type` with rabbitmq-c directly, as another application would.
void DeclareForeignExchange(const std::string& name, const char* type) {
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t* sock = amqp_tcp_socket_new(conn);
  ASSERT_EQ(amqp_socket_open(sock, "127.0.0.1", Broker()->port()), AMQP_STATUS_OK);
  ASSERT_EQ(
      amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest").reply_type,
      AMQP_RESPONSE_NORMAL);
  amqp_channel_open(conn, 1);
  amqp_exchange_declare(conn, 1, amqp_cstring_bytes(name.c_str()), amqp_cstring_bytes(type), 0, 1,
                        0, 0, amqp_empty_table);
  EXPECT_EQ(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
}

TEST(RabbitMqDriver, OptionsAreValidated) {
  RabbitMqOptions o;
  o.amqp.frame_max = 100;
  absl::Status st = NewRabbitMqDriver(o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_TRUE(absl::StrContains(st.message(), "amqp.frame_max")) << st;
  o = RabbitMqOptions{};
  o.queues.type = RabbitMqOptions::Queues::Type::kClassic;
  o.queues.delivery_limit = 3;
  EXPECT_TRUE(absl::StrContains(NewRabbitMqDriver(o).status().message(), "delivery_limit"));
  o = RabbitMqOptions{};
  o.tls.ca_file = "/ca.pem";
  EXPECT_TRUE(absl::StrContains(NewRabbitMqDriver(o).status().message(), "tls.ca_file"));
  o = RabbitMqOptions{};
  o.password = "hunter2-secret";
  EXPECT_FALSE(absl::StrContains(ToString(o), "hunter2-secret")) << ToString(o);
}

TEST(RabbitMqDriver, WrongCredentialsAreUnauthenticatedNamingTheUserNotThePassword) {
  RabbitMqOptions o = Options();
  o.password = "wrong-secret-123";
  std::shared_ptr<Driver> d = Open(o);
  ASSERT_NE(d, nullptr);
  absl::Status st = d->CreateQueue("creds", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "'guest'")) << st;
  EXPECT_FALSE(absl::StrContains(st.message(), "wrong-secret-123")) << st;
  absl::Status consumer = d->NewConsumer("creds", {1, absl::Seconds(5)}).status();
  EXPECT_TRUE(absl::IsUnauthenticated(consumer)) << consumer;
  EXPECT_FALSE(absl::StrContains(consumer.message(), "wrong-secret-123"));
}

TEST(RabbitMqDriver, AMissingVhostIsFailedPreconditionNamingIt) {
  RabbitMqOptions o = Options();
  o.vhost = "no-such-vhost";
  std::shared_ptr<Driver> d = Open(o);
  ASSERT_NE(d, nullptr);
  absl::Status st = d->SendToQueue("q", "x", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "no-such-vhost")) << st;
}

TEST(RabbitMqDriver, AnExchangeOfAnotherTypeIsFailedPreconditionNamingIt) {
  DeclareForeignExchange("orders-direct", "direct");
  std::shared_ptr<Driver> d = Open();
  ASSERT_NE(d, nullptr);
  absl::Status st = d->Subscribe("orders-direct", "orders-q", "a.*");
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "orders-direct")) << st;
  st = d->SendToTopic("orders-direct", "x", "a.b");
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  // The driver's connection survives the broker's channel error.
  EXPECT_TRUE(d->SendToQueue("orders-q", "after", absl::ZeroDuration()).ok());
}

TEST(RabbitMqDriver, AQueueOfOtherArgumentsIsFailedPreconditionNotAHang) {
  RabbitMqOptions classic = Options();
  classic.queues.type = RabbitMqOptions::Queues::Type::kClassic;
  std::shared_ptr<Driver> a = Open(classic);
  std::shared_ptr<Driver> b = Open();  // quorum
  ASSERT_TRUE(a->CreateQueue("typed", absl::ZeroDuration()).ok());
  const absl::Time start = absl::Now();
  absl::Status st = b->CreateQueue("typed", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "typed")) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::Status consumer = b->NewConsumer("typed", {1, absl::Seconds(5)}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(consumer)) << consumer;
  EXPECT_TRUE(b->Ping(absl::Seconds(5)).ok());
}

TEST(RabbitMqDriver, BodiesLargerThanAFrameAreSplitIntoFrames) {
  RabbitMqOptions o = Options();
  o.amqp.frame_max = 4096;
  std::shared_ptr<Driver> d = Open(o);
  std::string big(200 * 1024, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 13 % 251);
  ASSERT_TRUE(d->SendToQueue("frames", big, absl::ZeroDuration()).ok());
  auto c = d->NewConsumer("frames", {1, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<Delivery> got = ReceiveN(c->get(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, big);
  EXPECT_TRUE((*c)->Ack(got[0].receipt).ok());
}

TEST(RabbitMqDriver, AChannelClosedMidBatchFailsTheBatchAndTheNextSendWorks) {
  std::shared_ptr<Driver> d = Open();
  std::vector<std::string> batch = {"one", std::string(kBrokerMaxMessage + 1024, 'x'), "three"};
  const absl::Time start = absl::Now();
  absl::Status st = d->SendBatchToQueue("midbatch", batch, absl::ZeroDuration());
  EXPECT_FALSE(st.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(d->SendToQueue("midbatch", "after", absl::ZeroDuration()).ok());
}

// Disabled until fixed: on the merged 0.8 tree the consumer does not consume again within 30 s
// after the broker cancelled it (issue 41 stays open).
TEST(RabbitMqDriver, DISABLED_AConsumerCancelledByTheBrokerConsumesAgain) {
  std::shared_ptr<Driver> d = Open();
  std::shared_ptr<Driver> other = Open();
  auto c = d->NewConsumer("cancelled", {4, absl::Seconds(30)});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(other->DeleteQueue("cancelled").ok());  // the broker cancels the consumer
  // Sent again (the queue is declared anew), the message reaches the consumer.
  std::vector<Delivery> got;
  ASSERT_TRUE(WaitUntil(
      [&] {
        EXPECT_TRUE(other->SendToQueue("cancelled", "again", absl::ZeroDuration()).ok());
        EXPECT_TRUE((*c)->Receive(1, absl::Milliseconds(500), {}, &got).ok());
        return !got.empty();
      },
      absl::Seconds(30)));
  EXPECT_EQ(got[0].data, "again");
}

TEST(RabbitMqDriver, ABlockedConnectionIsResourceExhaustedUntilUnblocked) {
  std::shared_ptr<Driver> d = Open();
  ASSERT_TRUE(d->SendToQueue("blocked", "before", absl::ZeroDuration()).ok());
  ASSERT_TRUE(Broker()->Ctl({"set_vm_memory_high_watermark", "0.0000001"}).ok());
  absl::Status st;
  EXPECT_TRUE(WaitUntil(
      [&] {
        st = d->SendToQueue("blocked", "during", absl::ZeroDuration());
        return absl::IsResourceExhausted(st);
      },
      absl::Seconds(60)))
      << st;
  ASSERT_TRUE(Broker()->Ctl({"set_vm_memory_high_watermark", "0.4"}).ok());
  EXPECT_TRUE(
      WaitUntil([&] { return d->SendToQueue("blocked", "after", absl::ZeroDuration()).ok(); },
                absl::Seconds(60)));
}

}  // namespace
}  // namespace bus::testing
