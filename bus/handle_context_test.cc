// HandleContext::Step: nothing without a listener (a Handler's context); with one (the
// simulator's), each call reaches it with its name, in order.

#include "bus/handle_context.h"

#include <stop_token>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "bus/clock.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

class Recorder final : public StepListener {
 public:
  void OnStep(absl::string_view name) const override { steps.emplace_back(name); }
  mutable std::vector<std::string> steps;
};

TEST(HandleContext, AStepWithoutAListenerDoesNothing) {
  const HandleContext ctx;
  ctx.Step("debit");
  EXPECT_FALSE(ctx.stopping());
}

TEST(HandleContext, EachStepReachesTheListener) {
  FakeClock clock;
  Recorder recorder;
  const HandleContext ctx(std::stop_token(), clock, 2, &recorder);
  ctx.Step("debit");
  ctx.Step("credit");
  EXPECT_EQ(recorder.steps, (std::vector<std::string>{"debit", "credit"}));
  EXPECT_EQ(ctx.deliveries(), 2);
}

}  // namespace
}  // namespace bus
