#include "orders.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bus/handler.h"

namespace orders {

absl::Status Charger::Charge(const bus::Message& msg) {
  int64_t cents = 0;
  if (!absl::SimpleAtoi(msg.payload, &cents) || cents <= 0) {
    return bus::Permanent(absl::InvalidArgumentError(absl::StrCat("bad amount: ", msg.payload)));
  }
  if (cents > limit_cents_) return absl::UnavailableError("card declined");
  charged_cents_ += cents;
  return absl::OkStatus();
}

}  // namespace orders
