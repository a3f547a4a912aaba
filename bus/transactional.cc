#include "bus/transactional.h"

namespace bus {

const HandleContext& Transaction::context() const {
  static const HandleContext* const never_stops = new HandleContext();
  return context_ != nullptr ? *context_ : *never_stops;
}

}  // namespace bus
