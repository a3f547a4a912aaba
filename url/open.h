// Opens a driver or a store from a connection URL (url/url.h has the forms and parameters):
//
//   absl::StatusOr<std::shared_ptr<bus::Driver>> driver = bus::OpenDriver("redis://cache:6379/1");
//   absl::StatusOr<bus::Stores> stores = bus::OpenStores("sqlite:///var/lib/orders/bus.db");
//
// One call per kind: OpenDriver (memory, redis, nsq, amqp, nats, kafka, postgres),
// OpenDeadLetterStore and OpenIdempotencyStore (memory, redis, sqlite, postgres), and OpenStores
// for both over one connection (one SQLite database, one PostgreSQL database and its pool, or one
// Redis address). Like the factories they call, none of them connects: an unreachable server shows
// up as Unavailable from the first call that needs it.
//
// Errors: InvalidArgument naming the URL part or parameter (never with the password or secret),
// or what the factory returns (SqliteDatabase::Open opens the file).
//
// Thread-safety: free functions without shared state; the objects are as their headers say.

#ifndef URL_OPEN_H_
#define URL_OPEN_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bus/clock.h"
#include "bus/driver.h"
#include "bus/logger.h"
#include "bus/stores.h"
#include "url/url.h"

namespace bus {

// What a URL cannot say: objects passed in. Every field is optional.
struct OpenOverrides {
  // Clock for the driver or store (each factory's default: RealClock()).
  std::shared_ptr<Clock> clock{};
  // Logger for drivers (each driver's default when null).
  std::shared_ptr<Logger> logger{};
  // Where the URL's secrets are read from when it holds none (REDIS_PASSWORD, NSQ_AUTH_SECRET,
  // RABBITMQ_USER and RABBITMQ_PASSWORD, NATS_TOKEN, KAFKA_USERNAME and KAFKA_PASSWORD and the
  // like). Default: the process
  // environment.
  GetEnv env{};
};

absl::StatusOr<std::shared_ptr<Driver>> OpenDriver(absl::string_view url,
                                                   const OpenOverrides& overrides = {});

absl::StatusOr<std::shared_ptr<DeadLetterStore>> OpenDeadLetterStore(
    absl::string_view url, const OpenOverrides& overrides = {});

absl::StatusOr<std::shared_ptr<IdempotencyStore>> OpenIdempotencyStore(
    absl::string_view url, const OpenOverrides& overrides = {});

struct Stores {
  std::shared_ptr<DeadLetterStore> dead_letters{};
  std::shared_ptr<IdempotencyStore> idempotency{};
};

// Both stores from one URL, sharing the SQLite database when it is sqlite://, the PostgreSQL
// database (its connection pool and schema) when it is postgres:// or postgresql://.
absl::StatusOr<Stores> OpenStores(absl::string_view url, const OpenOverrides& overrides = {});

}  // namespace bus

#endif  // URL_OPEN_H_
