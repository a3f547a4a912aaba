// The example service: orders on the memory driver, dead letters and idempotency keys in a
// SQLite file. Publishes three orders (one with a bad amount), handles them, prints a summary.
//
//   bazel run //:orders_service -- /tmp/orders.db

#include <cstdio>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "bus/handler.h"
#include "bus/publisher.h"
#include "bus/version.h"
#include "drivers/memory/memory_driver.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "orders.h"
#include "storage/sqlite/dead_letter_store.h"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "/tmp/orders-consumer.db";
  absl::StatusOr<std::shared_ptr<bus::SqliteDatabase>> db =
      bus::SqliteDatabase::Open({.path = path});
  if (!db.ok()) {
    std::fprintf(stderr, "orders: %s\n", db.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<bus::Driver> driver = bus::NewMemoryDriver();
  absl::StatusOr<bus::Publisher> publisher = bus::Publisher::Create(driver);
  if (!publisher.ok()) {
    std::fprintf(stderr, "orders: %s\n", publisher.status().ToString().c_str());
    return 1;
  }
  orders::Charger charger(/*limit_cents=*/100000);

  bus::HandlerOptions options;
  options.queue = "orders";
  options.driver = driver;
  options.stores.dead_letters = bus::NewSqliteDeadLetterStore(*db);
  options.stores.idempotency = bus::NewSqliteIdempotencyStore(*db);
  options.handle = [&](const bus::Message& msg) { return charger.Charge(msg); };
  absl::StatusOr<std::unique_ptr<bus::Handler>> handler = bus::Handler::Create(options);
  if (!handler.ok()) {
    std::fprintf(stderr, "orders: %s\n", handler.status().ToString().c_str());
    return 1;
  }
  // The Handler runs on a thread of its own; destroying it (any return below) stops it and
  // joins that thread.
  if (absl::Status s = (*handler)->Start(); !s.ok()) {
    std::fprintf(stderr, "orders: %s\n", s.ToString().c_str());
    return 1;
  }
  if (absl::Status s = (*handler)->WaitUntilRunning(absl::Seconds(10)); !s.ok()) {
    std::fprintf(stderr, "orders: %s\n", s.ToString().c_str());
    return 1;
  }

  const std::string run = std::to_string(absl::ToUnixMicros(absl::Now()));
  for (const char* amount : {"1250", "990", "twelve"}) {
    absl::StatusOr<std::string> id =
        publisher->SendToQueue("orders", {.biz_uid = run + "-" + amount, .payload = amount});
    if (!id.ok()) {
      std::fprintf(stderr, "orders: %s\n", id.status().ToString().c_str());
      return 1;
    }
  }
  while ((*handler)->Stats().succeeded + (*handler)->Stats().dead_lettered < 3) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  (*handler)->Stop();
  if (absl::Status s = (*handler)->Wait(); !s.ok()) {
    std::fprintf(stderr, "orders: %s\n", s.ToString().c_str());
    return 1;
  }
  const bus::HandlerStats stats = (*handler)->Stats();
  std::printf("bus %s: %lld handled, %lld dead-lettered, %lld cents charged\n",
              std::string(bus::Version()).c_str(), static_cast<long long>(stats.succeeded),
              static_cast<long long>(stats.dead_lettered),
              static_cast<long long>(charger.charged_cents()));
  return stats.succeeded == 2 && stats.dead_lettered == 1 ? 0 : 1;
}
