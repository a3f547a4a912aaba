// busctl ui: the web console (admin/console.h, docs/console.md) for a broker and its dead-letter
// store, served by busctl for an operator who has only their URLs (no Handler runs here, so the
// console shows counts and dead letters, and purges, but does not replay: replay from the
// service's own console, or with `busctl dead-letters replay`).
//
// Thread-safety: ServeUi blocks its caller's thread.

#ifndef BUSCTL_UI_H_
#define BUSCTL_UI_H_

#include <memory>
#include <ostream>
#include <stop_token>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bus/driver.h"
#include "bus/stores.h"

namespace busctl {

struct Listen {
  std::string address{};
  int port = 0;
};

// "HOST:PORT" or "[V6]:PORT" with an IP literal host (no name lookup); InvalidArgument naming
// what is wrong.
absl::StatusOr<Listen> ParseListen(absl::string_view text);

// Serves /ui and /api on `listen` until `stop` is requested; writes the console's URL to `out`
// once it listens. Writes need the token in $BUS_CONSOLE_WRITE_TOKEN (never a flag: a command
// line is visible to every user). `dead_letters` may be null (no dead-letter pages).
absl::Status ServeUi(const Listen& listen, std::shared_ptr<bus::Driver> driver,
                     std::shared_ptr<bus::DeadLetterStore> dead_letters, std::ostream& out,
                     std::stop_token stop);

// The command: ServeUi on ParseListen(listen) until SIGINT or SIGTERM (blocked in the calling
// thread and taken by a sigwait thread, as `busctl tail` does), printing the URL to stderr.
absl::Status UiCommand(absl::string_view listen, std::shared_ptr<bus::Driver> driver,
                       std::shared_ptr<bus::DeadLetterStore> dead_letters);

}  // namespace busctl

#endif  // BUSCTL_UI_H_
