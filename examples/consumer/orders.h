// The example service's business logic: charge an order, once.

#ifndef ORDERS_H_
#define ORDERS_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "bus/message.h"

namespace orders {

// Charges the order in `msg` (its payload is the amount in cents). An amount that is not a
// number is a permanent failure (dead-lettered at once); a declined card (amount above the
// limit) is retryable.
class Charger {
 public:
  explicit Charger(int64_t limit_cents) : limit_cents_(limit_cents) {}
  absl::Status Charge(const bus::Message& msg);
  int64_t charged_cents() const { return charged_cents_.load(); }
  void set_limit(int64_t limit_cents) { limit_cents_ = limit_cents; }

 private:
  std::atomic<int64_t> limit_cents_;
  std::atomic<int64_t> charged_cents_{0};
};

}  // namespace orders

#endif  // ORDERS_H_
