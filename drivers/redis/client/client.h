// Client: the Redis stores' connection to their server (storage/redis, idempotency/redis): an
// IoThread with one pipelined Connection, configured from RedisOptions.
//
// Thread-safety: conn() is safe for concurrent use (see connection.h).

#ifndef DRIVERS_REDIS_CLIENT_CLIENT_H_
#define DRIVERS_REDIS_CLIENT_CLIENT_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "drivers/redis/client/connection.h"
#include "drivers/redis/client/redis_options.h"

namespace bus {
namespace redis {

// Health check over `conn`: PING within `timeout`; OK when the server answered PONG, else the
// transport error (Unavailable, DeadlineExceeded) or the error reply's status.
absl::Status Ping(Connection& conn, absl::Duration timeout);

// An IoThread with one pipelined Connection, for the stores. Requests time out after
// options.request_timeout.
class Client {
 public:
  // `options` must be valid (ValidateRedisOptions).
  explicit Client(const RedisOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Connection& conn() { return *conn_; }

 private:
  std::unique_ptr<IoThread> io_;
  std::shared_ptr<Connection> conn_;
};

}  // namespace redis
}  // namespace bus

#endif  // DRIVERS_REDIS_CLIENT_CLIENT_H_
