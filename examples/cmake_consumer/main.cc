// A program built against the installed msgbus package, outside this repository's build:
// publishes one message on the in-process memory driver and handles it, with dead letters and
// idempotency keys in a SQLite file. Prints the library's version and the message and exits 0
// once the message was handled once; exits 1 on an error or if it was not handled within 30
// seconds. tools/cmake_check.sh builds it with find_package and with pkg-config (CMakeLists.txt
// beside this file) and runs it.
//
//   cmake_consumer /tmp/consumer.db

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "bus/version.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/memory/memory_driver.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SQLITE_FILE\n", argv[0]);
    return 1;
  }
  bus::SqliteOptions sqlite;
  sqlite.path = argv[1];
  absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db = bus::SqliteDatabase::Open(sqlite);
  if (!db.ok()) {
    std::fprintf(stderr, "%s\n", db.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<bus::Driver> driver = bus::NewMemoryDriver();
  absl::StatusOr<bus::Publisher> publisher = bus::Publisher::Create(driver);
  if (!publisher.ok()) {
    std::fprintf(stderr, "%s\n", publisher.status().ToString().c_str());
    return 1;
  }

  absl::Mutex mu;
  std::string handled_payload;  // guarded by mu
  int handled = 0;              // guarded by mu

  bus::HandlerOptions options;
  options.queue = "orders";
  options.driver = driver;
  options.stores.dead_letters = bus::NewSqliteDeadLetterStore(*db);
  options.stores.idempotency = bus::NewSqliteIdempotencyStore(*db);
  options.handle = [&](const bus::Message& msg) -> absl::Status {
    absl::MutexLock lock(&mu);
    handled_payload = msg.payload;
    ++handled;
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(options);
  if (!handler.ok()) {
    std::fprintf(stderr, "%s\n", handler.status().ToString().c_str());
    return 1;
  }
  // On a thread the Handler owns; destroying it stops it and joins that thread.
  if (absl::Status st = (*handler)->Start(); !st.ok()) {
    std::fprintf(stderr, "start: %s\n", st.ToString().c_str());
    return 1;
  }

  const bus::Outgoing order = {.biz_uid = "order-42", .payload = "{\"amount\": 42}"};
  absl::StatusOr<std::string> id = publisher->SendToQueue("orders", order);

  bool done = false;
  if (id.ok()) {
    const absl::Condition handled_once(
        +[](int* n) { return *n > 0; }, &handled);
    absl::MutexLock lock(&mu);
    done = mu.AwaitWithTimeout(handled_once, absl::Seconds(30));
  }
  (*handler)->Stop();
  const absl::Status run_status = (*handler)->Wait();

  if (!id.ok()) {
    std::fprintf(stderr, "publish: %s\n", id.status().ToString().c_str());
    return 1;
  }
  if (!run_status.ok()) {
    std::fprintf(stderr, "run: %s\n", run_status.ToString().c_str());
    return 1;
  }
  absl::MutexLock lock(&mu);
  if (!done || handled != 1 || handled_payload != order.payload) {
    std::fprintf(stderr, "handled %d time(s), payload \"%s\"\n", handled, handled_payload.c_str());
    return 1;
  }
  std::printf("msgbus %s: handled %s: %s\n", std::string(bus::Version()).c_str(), id->c_str(),
              handled_payload.c_str());
  return 0;
}
