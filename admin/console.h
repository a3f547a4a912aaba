// Console: the web console's JSON API (/api/...) and its pages (/ui...), served by the admin
// server (admin/admin_server.h) when AdminServerOptions::console.enabled is set, and by
// `busctl ui`. docs/console.md lists every endpoint and what it answers.
//
//   bus::AdminServerOptions options;
//   options.handlers = {handler.get()};
//   options.console.enabled = true;
//   options.console.handlers = {handler.get()};   // replay, stats and rates of these queues
//   options.console.write_token = token;          // else $BUS_CONSOLE_WRITE_TOKEN; else read-only
//
// What it reads:
//  - the driver's ListQueues / InspectQueue for every queue's ready, delayed and in-flight
//    counts (a count per queue, no scan of a queue);
//  - each handler's Stats(), sampled every `sample_interval` into a ring buffer that holds
//    `history` (15 minutes by default): the rates per second come from there, never from a
//    request;
//  - the dead-letter stores, through their bounded Fetch (pages) and Count.
// Writes (replay, purge) need `Authorization: Bearer <write_token>`; without a token every
// write answers 403. No answer carries a password or any other secret of a URL.
//
// Thread-safety: Serve() may be called from any thread at once (the admin server calls it on
// its probe pool); the sampler runs on a thread of its own until the Console is destroyed.

#ifndef ADMIN_CONSOLE_H_
#define ADMIN_CONSOLE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/handler.h"
#include "bus/stores.h"

namespace bus {

// The environment variable read when ConsoleOptions::write_token is empty.
inline constexpr char kConsoleWriteTokenEnv[] = "BUS_CONSOLE_WRITE_TOKEN";

struct ConsoleOptions {
  // Serve /api and /ui. Default false: the admin server answers 404 there.
  bool enabled = false;
  // The handlers whose queues the console shows with stats and rates, and replays through
  // (Handler::ReplayDeadLetters). Not null. They must outlive the console.
  std::vector<Handler*> handlers{};
  // The broker whose queues are listed. Default: the first handler's driver. Required without
  // handlers.
  std::shared_ptr<Driver> driver{};
  // Dead letters of queues that have no handler here. Default: the first handler's store.
  std::shared_ptr<DeadLetterStore> dead_letters{};
  // Writes need `Authorization: Bearer <write_token>`. Empty: $BUS_CONSOLE_WRITE_TOKEN; empty
  // too: read-only (every write answers 403).
  std::string write_token{};
  // How often each handler's Stats() is sampled; > 0. Default 5s.
  absl::Duration sample_interval = absl::Seconds(5);
  // How much of the past the ring buffer keeps; >= sample_interval. Default 15 minutes.
  absl::Duration history = absl::Minutes(15);
  // Bound on each Ping of /api/health; > 0. Default 1s.
  absl::Duration ping_timeout = absl::Seconds(1);
  // The sampler's clock. Default RealClock().
  std::shared_ptr<Clock> clock{};
};

// An HTTP request as the console needs it.
struct ConsoleRequest {
  std::string method{};  // "GET", "POST", ...
  std::string target{};  // path and query, e.g. "/api/queues?points=60"
  std::string authorization{};
  std::string body{};
};

struct ConsoleResponse {
  int status = 200;
  std::string content_type{};
  std::string body{};
  // More header fields (Allow, Content-Security-Policy, ...).
  std::vector<std::pair<std::string, std::string>> headers{};
};

class Console {
 public:
  // Validates `options` (InvalidArgument naming the field) and starts the sampler.
  static absl::StatusOr<std::unique_ptr<Console>> Create(ConsoleOptions options);

  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // True for the targets the console answers: /api, /api/..., /ui, /ui/...
  static bool Serves(absl::string_view path);

  // Answers one request. Blocks for the driver and store calls it makes (each bounded by the
  // driver's or store's own timeouts).
  ConsoleResponse Serve(const ConsoleRequest& request);

  // Whether writes are enabled (a write token is configured).
  bool writable() const;

 private:
  struct Impl;
  explicit Console(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bus

#endif  // ADMIN_CONSOLE_H_
