#include "admin/internal/console_health.h"

#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "bus/handler.h"

namespace bus::console_internal {

std::string HandlerState(const HandlerStats& s) {
  if (s.consuming && s.paused) return "paused";
  if (s.consuming && s.in_backoff) return "backing off";
  if (s.consuming) return "consuming";
  if (s.running) return "starting";
  return "stopped";
}

nlohmann::json HealthJson(const ConsoleOptions& options) {
  nlohmann::json out = {{"ok", true}};
  auto check = [&](absl::string_view what, absl::string_view detail, const absl::Status& st) {
    nlohmann::json e = {
        {"what", std::string(what)}, {"name", std::string(detail)}, {"ok", st.ok()}};
    if (!st.ok()) {
      e["error"] = st.ToString();
      out["ok"] = false;
    }
    out["checks"].push_back(std::move(e));
  };
  out["checks"] = nlohmann::json::array();
  check("broker", options.driver->name(), options.driver->Ping(options.ping_timeout));
  std::set<const void*> seen{options.driver.get()};
  for (Handler* h : options.handlers) {
    const HandlerOptions& o = h->options();
    if (o.driver != nullptr && seen.insert(o.driver.get()).second) {
      check("broker", o.driver->name(), o.driver->Ping(options.ping_timeout));
    }
    if (o.stores.dead_letters != nullptr && seen.insert(o.stores.dead_letters.get()).second) {
      check("dead-letter store", o.queue, o.stores.dead_letters->Ping(options.ping_timeout));
    }
    if (o.stores.idempotency != nullptr && seen.insert(o.stores.idempotency.get()).second) {
      check("idempotency store", o.queue, o.stores.idempotency->Ping(options.ping_timeout));
    }
  }
  if (options.dead_letters != nullptr && seen.insert(options.dead_letters.get()).second) {
    check("dead-letter store", "", options.dead_letters->Ping(options.ping_timeout));
  }
  nlohmann::json handlers = nlohmann::json::array();
  for (Handler* h : options.handlers) {
    handlers.push_back({{"queue", h->options().queue}, {"state", HandlerState(h->Stats())}});
  }
  out["handlers"] = std::move(handlers);
  return out;
}

}  // namespace bus::console_internal
