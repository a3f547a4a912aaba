// The console's view of the Handlers it serves (admin/console.cc): a Handler's state as the
// pages show it, and the health answer (one Ping of the broker and of every store).
// Private to //admin.
//
// Thread-safety: free functions; what they read (Stats, Ping) is safe from any thread.

#ifndef ADMIN_INTERNAL_CONSOLE_HEALTH_H_
#define ADMIN_INTERNAL_CONSOLE_HEALTH_H_

#include <string>

#include "admin/console.h"
#include "bus/stats.h"
#include "nlohmann/json.hpp"

namespace bus::console_internal {

// "paused" (Pause or SetMaxInFlight(0)), "backing off" (the consumer backoff holds intake),
// "consuming", "starting" (setting up, or retrying the broker) or "stopped".
std::string HandlerState(const HandlerStats& s);

// /api/health: {"ok", "checks": [{"what", "name", "ok", "error"}], "handlers": [{"queue",
// "state"}]}, each broker and store pinged once within options.ping_timeout.
nlohmann::json HealthJson(const ConsoleOptions& options);

}  // namespace bus::console_internal

#endif  // ADMIN_INTERNAL_CONSOLE_HEALTH_H_
