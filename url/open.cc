#include "url/open.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/kafka/kafka_driver.h"
#include "drivers/nsq/nsq_driver.h"
#include "url/kafka_url.h"
#include "drivers/postgres/postgres_driver.h"
#include "drivers/redis/redis_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "idempotency/postgres/idempotency_store.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "storage/postgres/dead_letter_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"

namespace bus {
namespace {

GetEnv EnvOf(const OpenOverrides& o) { return o.env ? o.env : ProcessEnv(); }

absl::Status UnknownScheme(const ParsedUrl& url, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("URL scheme: \"", url.scheme, "\" is not one of ", want));
}

absl::Status NoParams(const ParsedUrl& url) {
  if (!url.hosts.empty() || !url.path.empty() || !url.user.empty()) {
    return absl::InvalidArgumentError("URL host: memory:// takes no host or path");
  }
  if (!url.params.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("URL parameter: unknown: ", url.params.front().first));
  }
  return absl::OkStatus();
}

absl::StatusOr<RedisOptions> Redis(const ParsedUrl& url, const OpenOverrides& o) {
  absl::StatusOr<RedisOptions> redis = RedisOptionsFromUrl(url, EnvOf(o));
  if (!redis.ok()) return redis.status();
  if (o.clock != nullptr) redis->clock = o.clock;
  if (o.logger != nullptr) redis->logger = o.logger;
  return redis;
}

bool IsRedis(const ParsedUrl& url) {
  return url.scheme == "redis" || url.scheme == "redis+cluster" || url.scheme == "rediss" ||
         url.scheme == "rediss+cluster" || url.scheme == "redis+sentinel" ||
         url.scheme == "rediss+sentinel" || url.scheme == "unix" || url.scheme == "redis+unix";
}

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> OpenDriver(absl::string_view text, const OpenOverrides& o) {
  if (IsPostgresUrl(text)) {
    // As for the stores: libpq parses the URL; the driver's tables live in its schema.
    absl::StatusOr<PostgresUrlOptions> pg = PostgresOptionsFromUrl(text);
    if (!pg.ok()) return pg.status();
    if (o.clock != nullptr) pg->db.clock = o.clock;
    absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(pg->db);
    if (!driver.ok()) return driver.status();
    return std::shared_ptr<Driver>(*std::move(driver));
  }
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  if (url->scheme == "memory") {
    absl::StatusOr<MemoryUrlOptions> m = MemoryOptionsFromUrl(*url);
    if (!m.ok()) return m.status();
    return NewMemoryDriver({.clock = o.clock, .max_message_bytes = m->max_message_bytes});
  }
  if (IsRedis(*url)) {
    absl::StatusOr<RedisOptions> redis = Redis(*url, o);
    if (!redis.ok()) return redis.status();
    return NewRedisDriver(*std::move(redis));
  }
  if (url->scheme == "nsq") {
    absl::StatusOr<NsqOptions> nsq = NsqOptionsFromUrl(*url, EnvOf(o));
    if (!nsq.ok()) return nsq.status();
    if (o.clock != nullptr) nsq->clock = o.clock;
    if (o.logger != nullptr) nsq->logger = o.logger;
    return NewNsqDriver(*std::move(nsq));
  }
  if (url->scheme == "kafka") {
    absl::StatusOr<KafkaOptions> kafka = KafkaOptionsFromUrl(*url, EnvOf(o));
    if (!kafka.ok()) return kafka.status();
    if (o.clock != nullptr) kafka->clock = o.clock;
    if (o.logger != nullptr) kafka->logger = o.logger;
    return NewKafkaDriver(*std::move(kafka));
  }
  return UnknownScheme(*url, "memory, redis, nsq, postgres, kafka");
}

absl::StatusOr<Stores> OpenStores(absl::string_view text, const OpenOverrides& o) {
  if (IsPostgresUrl(text)) {
    // libpq parses these URLs (url.h): the generic parser below would refuse some of its forms.
    absl::StatusOr<PostgresUrlOptions> pg = PostgresOptionsFromUrl(text);
    if (!pg.ok()) return pg.status();
    if (o.clock != nullptr) pg->db.clock = o.clock;
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(pg->db);
    if (!db.ok()) return db.status();
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> dl =
        NewPostgresDeadLetterStore(*db, pg->dead_letters);
    if (!dl.ok()) return dl.status();
    absl::StatusOr<std::shared_ptr<IdempotencyStore>> idem =
        NewPostgresIdempotencyStore(*db, pg->idempotency);
    if (!idem.ok()) return idem.status();
    return Stores{*std::move(dl), *std::move(idem)};
  }
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  Stores s;
  if (url->scheme == "memory") {
    if (absl::Status st = NoParams(*url); !st.ok()) return st;
    s.dead_letters = NewMemoryDeadLetterStore(o.clock);
    s.idempotency = NewMemoryIdempotencyStore({.clock = o.clock});
    return s;
  }
  if (IsRedis(*url)) {
    absl::StatusOr<RedisOptions> redis = Redis(*url, o);
    if (!redis.ok()) return redis.status();
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> dl = NewRedisDeadLetterStore(*redis);
    if (!dl.ok()) return dl.status();
    absl::StatusOr<std::shared_ptr<IdempotencyStore>> idem = NewRedisIdempotencyStore(*redis);
    if (!idem.ok()) return idem.status();
    s.dead_letters = *std::move(dl);
    s.idempotency = *std::move(idem);
    return s;
  }
  if (url->scheme == "sqlite") {
    absl::StatusOr<SqliteUrlOptions> sqlite = SqliteOptionsFromUrl(*url);
    if (!sqlite.ok()) return sqlite.status();
    if (o.clock != nullptr) sqlite->db.clock = o.clock;
    absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(sqlite->db);
    if (!db.ok()) return db.status();
    absl::StatusOr<std::shared_ptr<DeadLetterStore>> dl =
        NewSqliteDeadLetterStore(*db, sqlite->dead_letters);
    if (!dl.ok()) return dl.status();
    absl::StatusOr<std::shared_ptr<IdempotencyStore>> idem =
        NewSqliteIdempotencyStore(*db, sqlite->idempotency);
    if (!idem.ok()) return idem.status();
    s.dead_letters = *std::move(dl);
    s.idempotency = *std::move(idem);
    return s;
  }
  return UnknownScheme(*url, "memory, redis, sqlite, postgres");
}

absl::StatusOr<std::shared_ptr<DeadLetterStore>> OpenDeadLetterStore(absl::string_view url,
                                                                     const OpenOverrides& o) {
  absl::StatusOr<Stores> s = OpenStores(url, o);
  if (!s.ok()) return s.status();
  return s->dead_letters;
}

absl::StatusOr<std::shared_ptr<IdempotencyStore>> OpenIdempotencyStore(absl::string_view url,
                                                                       const OpenOverrides& o) {
  absl::StatusOr<Stores> s = OpenStores(url, o);
  if (!s.ok()) return s.status();
  return s->idempotency;
}

}  // namespace bus
