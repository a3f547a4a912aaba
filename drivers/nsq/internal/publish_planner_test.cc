#include "drivers/nsq/internal/publish_planner.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bus::nsq {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(1000);

TEST(PublishOrderTest, PreferKeepsTheConfiguredOrder) {
  const std::vector<NsqdHealth> h(3);
  for (uint64_t turn = 0; turn < 5; ++turn) {
    EXPECT_THAT(PublishOrder(false, h, kNow, turn), ElementsAre(0, 1, 2));
  }
}

TEST(PublishOrderTest, PreferSkipsAnNsqdThatBacksOffUntilItsRetryTime) {
  std::vector<NsqdHealth> h(3);
  h[0].retry_at = kNow + absl::Seconds(1);
  EXPECT_THAT(PublishOrder(false, h, kNow, 0), ElementsAre(1, 2));
  // Its retry time has come: it is first again.
  EXPECT_THAT(PublishOrder(false, h, kNow + absl::Seconds(1), 0), ElementsAre(0, 1, 2));
}

TEST(PublishOrderTest, SpreadRotatesByTurn) {
  const std::vector<NsqdHealth> h(3);
  EXPECT_THAT(PublishOrder(true, h, kNow, 0), ElementsAre(0, 1, 2));
  EXPECT_THAT(PublishOrder(true, h, kNow, 1), ElementsAre(1, 2, 0));
  EXPECT_THAT(PublishOrder(true, h, kNow, 2), ElementsAre(2, 0, 1));
  EXPECT_THAT(PublishOrder(true, h, kNow, 3), ElementsAre(0, 1, 2));
}

TEST(PublishOrderTest, SpreadRotatesOverTheHealthyOnesOnly) {
  // One of three down: the other two take turns evenly (not 2:1, as rotating over all three
  // and skipping the down one would give).
  std::vector<NsqdHealth> h(3);
  h[1].retry_at = kNow + absl::Milliseconds(1);
  int first[3] = {0, 0, 0};
  for (uint64_t turn = 0; turn < 100; ++turn) {
    const std::vector<size_t> order = PublishOrder(true, h, kNow, turn);
    ASSERT_EQ(order.size(), 2u);
    EXPECT_NE(order[0], order[1]);
    ++first[order[0]];
  }
  EXPECT_EQ(first[0], 50);
  EXPECT_EQ(first[1], 0);
  EXPECT_EQ(first[2], 50);
}

TEST(PublishOrderTest, UnlistedNsqdAreNotCandidates) {
  std::vector<NsqdHealth> h(3);
  h[0].listed = false;
  EXPECT_THAT(PublishOrder(false, h, kNow, 0), ElementsAre(1, 2));
  EXPECT_THAT(PublishOrder(true, h, kNow, 1), ElementsAre(2, 1));
}

TEST(PublishOrderTest, NoCandidateIsAnEmptyOrder) {
  std::vector<NsqdHealth> h(2);
  h[0].retry_at = kNow + absl::Seconds(1);
  h[1].listed = false;
  EXPECT_THAT(PublishOrder(true, h, kNow, 7), IsEmpty());
  EXPECT_THAT(PublishOrder(false, {}, kNow, 0), IsEmpty());
}

}  // namespace
}  // namespace bus::nsq
