// The subject scheme: names and route keys map onto valid subjects and back, and a binding key
// maps onto filters exactly when NATS wildcards can express it.

#include "drivers/nats/internal/subjects.h"

#include <string>

#include "bus/route_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bus::nats {
namespace {

using ::testing::ElementsAre;

TEST(SubjectsTest, NamesWithDotsStayOneToken) {
  Subjects s("bus");
  EXPECT_EQ(s.Queue("a.b"), "bus.q.a~b");
  EXPECT_EQ(s.Delayed("a.b", "id1"), "bus.d.a~b.id1");
  EXPECT_EQ(Subjects::ConsumerName("a.b"), "q-a~b");
  EXPECT_EQ(Subjects::QueueOfConsumer("q-a~b"), "a.b");
  EXPECT_EQ(Subjects::QueueOfConsumer("schedules"), std::nullopt);
}

TEST(SubjectsTest, RouteKeysRoundTripWhateverTheirBytes) {
  Subjects s("bus");
  for (const std::string key : {"", "order.created", "a..b", "sp ace.*.>", "#", "x.y.z"}) {
    std::string topic, back;
    ASSERT_TRUE(s.ParseTopic(s.Topic("t.1", key), &topic, &back)) << key;
    EXPECT_EQ(topic, "t.1");
    EXPECT_EQ(back, key);
  }
  EXPECT_EQ(s.Topic("t", "order.created"), "bus.t.t.order.created");
  EXPECT_EQ(s.Topic("t", ""), "bus.t.t");
  std::string topic, key;
  EXPECT_FALSE(s.ParseTopic("bus.q.x", &topic, &key));
}

TEST(SubjectsTest, BindingKeysMapOntoWildcardsWhereTheyCan) {
  Subjects s("bus");
  EXPECT_THAT(*s.BindingFilters("t", "order.*"), ElementsAre("bus.t.t.order.*"));
  EXPECT_THAT(*s.BindingFilters("t", "order.#"), ElementsAre("bus.t.t.order", "bus.t.t.order.>"));
  EXPECT_THAT(*s.BindingFilters("t", ""), ElementsAre("bus.t.t", "bus.t.t.>"));
  EXPECT_THAT(*s.BindingFilters("t", "#"), ElementsAre("bus.t.t", "bus.t.t.>"));
  EXPECT_THAT(*s.BindingFilters("t", "a.b"), ElementsAre("bus.t.t.a.b"));
  // '#' before the last word has no NATS equivalent: the matcher decides.
  EXPECT_EQ(s.BindingFilters("t", "a.#.b"), std::nullopt);
  EXPECT_EQ(s.BindingFilters("t", "#.b"), std::nullopt);
}

}  // namespace
}  // namespace bus::nats
