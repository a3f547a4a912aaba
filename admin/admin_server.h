// AdminServer: the HTTP endpoints an orchestrator and a Prometheus server poll, on an address
// and port of their own (Boost.Beast, one I/O thread):
//
//   GET /metrics  the registry's page in the Prometheus text format 0.0.4 (404 without one)
//   GET /healthz  200 while every handler's Run() is in progress (the process is alive and its
//                 loops run); else 503 with {"status":"unhealthy","reason":"..."}
//   GET /readyz   200 when every handler is consuming and its driver and stores answer Ping
//                 (Handler::Ready); else 503 with {"status":"not ready","reason":"..."}
//   /ui, /api/... the web console and its JSON API (admin/console.h, docs/console.md), when
//                 options.console.enabled; else 404
//
//   bus::AdminServerOptions options;
//   options.port = 9090;                 // 0: a free port, see port()
//   options.metrics = metrics;           // the one in HandlerOptions::observability.metrics
//   options.handlers = {handler.get()};
//   absl::StatusOr<std::unique_ptr<bus::AdminServer>> admin = bus::AdminServer::Start(options);
//   ...
//   (*admin)->Stop();                    // or destroy it; before the handlers are destroyed
//
// It never blocks a handler: /healthz reads the handlers' state; /readyz and /metrics (whose
// collectors may call a store) run on a small pool of their own, so a slow store delays those
// answers only, bounded by ping_timeout per Ping. docs/operations.md has the semantics.
//
// Ownership: the handlers must outlive the server (Stop() it first). Thread-safety: port(),
// connections() and Stop() may be called from any thread.

#ifndef ADMIN_ADMIN_SERVER_H_
#define ADMIN_ADMIN_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "admin/console.h"
#include "bus/handler.h"
#include "bus/metrics.h"

namespace bus {

struct AdminServerOptions {
  // Address to listen on (an IPv4 or IPv6 literal). Default 127.0.0.1; "0.0.0.0" for every
  // interface.
  std::string address = "127.0.0.1";
  // Port; 0 (the default) picks a free one (see AdminServer::port()). In [0, 65535].
  int port = 0;
  // Served at /metrics; null: /metrics answers 404.
  std::shared_ptr<MetricsRegistry> metrics{};
  // Probed by /healthz and /readyz; not null (the same type as ConsoleOptions::handlers). With
  // none, both answer 200.
  std::vector<Handler*> handlers{};
  // Bound on each Ping of /readyz; > 0. Default 1s.
  absl::Duration ping_timeout = absl::Seconds(1);
  // A connection must send a whole request and take the whole answer within this, or it is
  // closed (a client that pipelines requests and never reads holds nothing longer); > 0.
  // Default 10s.
  absl::Duration exchange_timeout = absl::Seconds(10);
  // Connections open at once; >= 1. Default 64. At the cap, the oldest connection is closed to
  // make room, so a probe always gets through; when the process runs out of file descriptors
  // (EMFILE), the oldest is closed too and accepting backs off (1ms doubling to 1s) instead of
  // spinning.
  int max_connections = 64;
  // Threads that answer /readyz, /metrics and the console; >= 1. Default 2.
  int probe_threads = 2;
  // The web console (admin/console.h); off by default.
  ConsoleOptions console{};
};

class AdminServer {
 public:
  // Binds and starts serving. InvalidArgument naming a bad option (console options as
  // Console::Create says); Unavailable when the address cannot be bound (in use, not local).
  static absl::StatusOr<std::unique_ptr<AdminServer>> Start(AdminServerOptions options);

  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // The port bound (the one chosen when options.port was 0).
  int port() const;

  // Connections open now.
  int connections() const;

  // Stops accepting, closes the connections and waits for the threads (a probe in progress
  // finishes first). Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit AdminServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace bus

#endif  // ADMIN_ADMIN_SERVER_H_
