#include "drivers/redis/client/client.h"

namespace bus {

namespace redis {

Client::Client(const RedisOptions& options)
    : io_(std::make_unique<IoThread>()),
      conn_(Connection::Create(io_.get(), ToConnectionOptions(options))) {}

Client::~Client() {
  conn_->Shutdown();
  conn_.reset();
  io_.reset();
}

}  // namespace redis

}  // namespace bus
