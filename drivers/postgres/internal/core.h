// Internal to the PostgreSQL driver: what the driver and its consumers share (the database, the
// options, the statements with the schema filled in, and the counters behind Driver::Stats), and
// the pieces of the send that the plain, the transactional and the libpq forms have in common.
//
// Thread-safety: QueueCore is immutable after construction apart from its atomic counters.

#ifndef DRIVERS_POSTGRES_INTERNAL_CORE_H_
#define DRIVERS_POSTGRES_INTERNAL_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/postgres/postgres_database.h"
#include "drivers/postgres/postgres_driver.h"

namespace bus::pg_internal {

// The statements of queue_sql.h with the driver's schema in them.
struct QueueSql {
  explicit QueueSql(const PostgresDatabase& db);

  std::string channel, create_queue, ensure_queue, bind, unbind, bindings, delete_messages,
      delete_queue, send, send_many, reserve, next_due, ack, ack_many, extend, nack, counts, peek,
      list_queues;
};

struct QueueCore {
  QueueCore(std::shared_ptr<PostgresDatabase> db, PostgresDriverOptions options)
      : db(std::move(db)), options(std::move(options)), sql(*this->db) {}

  const std::shared_ptr<PostgresDatabase> db;
  const PostgresDriverOptions options;
  const QueueSql sql;

  // Consumers waiting for a notification now (PostgresDriver::waiting_receives).
  std::atomic<int> waiting{0};
  // Consumer sessions opened again after one was lost, and sessions open now.
  std::atomic<uint64_t> reconnects{0};
  std::atomic<int64_t> sessions{0};
};

// The destinations of a send as the text of a PostgreSQL text[] ($1 of kSendSql). Queue names
// are validated (bus/names.h: [.a-zA-Z0-9_-]), so quoting each is enough.
std::string QueueArray(absl::Span<const std::string> queues);

// `items` as a PostgreSQL bytea[] in the binary format (array_recv: one dimension, no NULLs),
// $2 of kSendManySql.
std::string ByteaArray(absl::Span<const std::string> items);

// The queues among `bindings` (pairs of queue and binding key, as kBindingsSql returns them)
// whose key matches `route_key` (bus/route_key.h), each once, in the order first matched.
std::vector<std::string> MatchingQueues(
    absl::Span<const std::pair<std::string, std::string>> bindings, absl::string_view route_key);

// InvalidArgument when `data` is longer than the driver's max_message_bytes.
absl::Status CheckMessageSize(const PostgresDriverOptions& options, absl::string_view data);

}  // namespace bus::pg_internal

#endif  // DRIVERS_POSTGRES_INTERNAL_CORE_H_
