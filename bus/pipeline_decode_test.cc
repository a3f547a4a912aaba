// Step 1 of the pipeline (docs/pipeline.md): decoding, and poison messages as malformed dead
// letters.
// On the memory driver and memory stores with a fake clock (tests/testing/handler_fixture.h).

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bus/envelope.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "drivers/memory/memory_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "tests/testing/fault_injection.h"
#include "tests/testing/handler_fixture.h"
#include "tests/testing/letters.h"
#include "tests/testing/wait.h"

namespace bus {
namespace {

using ::bus::testing::FaultyDriver;
using ::bus::testing::HandlerTest;
using ::bus::testing::Recorder;
using ::bus::testing::WaitUntil;
using ::testing::HasSubstr;

TEST_F(HandlerTest, MalformedAndOversizedEnvelopesAreDeadLetteredAndTheQueueMovesOn) {
  Recorder rec;
  HandlerOptions o = Options([&](const Message& m) {
    rec.Add(m);
    return absl::OkStatus();
  });
  o.flow.max_message_bytes = 1024;
  Handler* h = Start(o);
  ASSERT_TRUE(driver_->SendToQueue("orders", "not an envelope", absl::ZeroDuration()).ok());
  std::string truncated = EncodeEnvelope(publisher_.Build(Outgoing{"t", "payload", {}}));
  truncated.resize(truncated.size() - 3);
  ASSERT_TRUE(driver_->SendToQueue("orders", truncated, absl::ZeroDuration()).ok());
  ASSERT_TRUE(driver_
                  ->SendToQueue(
                      "orders",
                      EncodeEnvelope(publisher_.Build(Outgoing{"big", std::string(2000, 'x'), {}})),
                      absl::ZeroDuration())
                  .ok());
  Publish("good", "fine");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && h->Stats().malformed == 3; }));
  EXPECT_EQ(rec.seen()[0].payload, "fine");
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 3u);
  std::map<std::string, std::string> reasons;
  for (const auto& l : letters) reasons[l.data.substr(0, 15)] = l.reason;
  EXPECT_THAT(reasons["not an envelope"], HasSubstr("malformed: envelope: bad magic"));
  int truncated_seen = 0, oversized_seen = 0;
  for (const auto& l : letters) {
    truncated_seen += absl::StrContains(l.reason, "claims") ? 1 : 0;
    oversized_seen += absl::StrContains(l.reason, "exceeds the limit of 1024") ? 1 : 0;
  }
  EXPECT_EQ(truncated_seen, 1);
  EXPECT_EQ(oversized_seen, 1);
  EXPECT_EQ(h->Stats().dead_lettered, 3u);
}

TEST_F(HandlerTest, ADeliveryWhoseBrokerRecordIsCorruptBecomesAMalformedLetter) {
  auto faulty = std::make_shared<FaultyDriver>(driver_);
  const std::string corrupt = EncodeEnvelope(Message{.id = "c1", .biz_uid = "corrupt"});
  faulty->corrupt_data = corrupt;
  std::atomic<int> calls{0};
  HandlerOptions o = Options([&](const Message&) {
    calls.fetch_add(1);
    return absl::OkStatus();
  });
  o.driver = faulty;
  Handler* h = Start(o);
  ASSERT_TRUE(driver_->SendToQueue("orders", corrupt, absl::ZeroDuration()).ok());
  Publish("fine", "x");
  ASSERT_TRUE(WaitUntil([&] { return h->Stats().succeeded == 1 && h->Stats().malformed == 1; }));
  EXPECT_EQ(calls.load(), 1);
  const auto letters = Letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].kind, DeadLetterKind::kMalformed);
  EXPECT_EQ(letters[0].data, corrupt);
  EXPECT_THAT(letters[0].reason, HasSubstr("broker record corrupt"));
}

}  // namespace
}  // namespace bus
