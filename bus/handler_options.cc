#include "bus/handler_options.h"

#include "absl/strings/cord.h"

namespace bus {
namespace {

constexpr char kPermanentPayloadUrl[] = "type.bus/permanent";

}  // namespace

absl::Status Permanent(absl::Status status) {
  if (status.ok()) status = absl::UnknownError("permanent failure");
  status.SetPayload(kPermanentPayloadUrl, absl::Cord("1"));
  return status;
}

bool IsPermanent(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kPermanentPayloadUrl).has_value();
}

absl::Status HandleFn::operator()(const Message& msg) const {
  static const HandleContext* const never_stops = new HandleContext();
  return fn_(msg, *never_stops);
}

}  // namespace bus
