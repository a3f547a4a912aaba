#include "drivers/redis/client/client.h"

#include "absl/strings/str_cat.h"

namespace bus {

namespace redis {

Client::Client(const RedisOptions& options)
    : io_(std::make_unique<IoThread>()),
      conn_(Connection::Create(io_.get(), ToConnectionOptions(options))) {}

absl::Status Ping(Connection& conn, absl::Duration timeout) {
  absl::StatusOr<Reply> r = conn.Command({"PING"}, timeout);
  if (!r.ok()) return r.status();
  if (r->is_error()) return ReplyStatus(*r);
  if (r->str != "PONG") {
    return absl::UnavailableError(absl::StrCat("redis PING answered \"", r->str, "\""));
  }
  return absl::OkStatus();
}

Client::~Client() {
  conn_->Shutdown();
  conn_.reset();
  io_.reset();
}

}  // namespace redis

}  // namespace bus
