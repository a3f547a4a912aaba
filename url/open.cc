#include "url/open.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/sqlite/sqlite_database.h"
#include "drivers/kafka/kafka_driver.h"
#include "drivers/memory/memory_driver.h"
#include "drivers/nats/nats_driver.h"
#include "drivers/nsq/nsq_driver.h"
#include "drivers/postgres/postgres_driver.h"
#include "drivers/rabbitmq/rabbitmq_driver.h"
#include "drivers/redis/redis_driver.h"
#include "idempotency/memory/memory_idempotency_store.h"
#include "idempotency/postgres/idempotency_store.h"
#include "idempotency/redis/redis_idempotency_store.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/memory/memory_dead_letter_store.h"
#include "storage/postgres/dead_letter_store.h"
#include "storage/redis/redis_dead_letter_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "url/kafka_url.h"
#include "url/memory_url.h"
#include "url/nats_url.h"
#include "url/nsq_url.h"
#include "url/postgres_url.h"
#include "url/rabbitmq_url.h"
#include "url/redis_url.h"
#include "url/sqlite_url.h"

namespace bus {
namespace {

GetEnv EnvOf(const OpenOverrides& o) { return o.env ? o.env : ProcessEnv(); }

// Logs each DeprecatedUrlParameters warning of `url` once per process, through the overrides'
// logger (else the default logger).
void WarnDeprecated(absl::string_view url, const OpenOverrides& o) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* const logged = new absl::flat_hash_set<std::string>();
  for (const std::string& warning : DeprecatedUrlParameters(url)) {
    {
      absl::MutexLock lock(&mu);
      if (!logged->insert(warning).second) continue;
    }
    const std::shared_ptr<Logger> logger =
        o.logger != nullptr ? o.logger : DefaultLogger(LogLevel::kWarning);
    LogRecord r;
    r.level = LogLevel::kWarning;
    r.time = absl::Now();
    r.component = "url";
    r.event = "deprecated_url_parameter";
    r.text = warning;
    logger->Write(r);
  }
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

absl::StatusOr<RedisOptions> Redis(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  absl::StatusOr<RedisOptions> redis = RedisOptionsFromUrl(*url, EnvOf(o));
  if (!redis.ok()) return redis.status();
  if (o.clock != nullptr) redis->clock = o.clock;
  if (o.logger != nullptr) redis->logger = o.logger;
  return redis;
}

// Each backend's openers, from the URL's text: each parses it once (libpq parses PostgreSQL's).

absl::StatusOr<std::shared_ptr<Driver>> OpenMemory(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  absl::StatusOr<MemoryUrlOptions> m = MemoryOptionsFromUrl(*url);
  if (!m.ok()) return m.status();
  return NewMemoryDriver({.clock = o.clock, .max_message_bytes = m->max_message_bytes});
}

absl::StatusOr<Stores> OpenMemoryStores(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  if (absl::Status st = NoParams(*url); !st.ok()) return st;
  return Stores{NewMemoryDeadLetterStore(o.clock), NewMemoryIdempotencyStore({.clock = o.clock})};
}

absl::StatusOr<std::shared_ptr<Driver>> OpenRedis(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<RedisOptions> redis = Redis(text, o);
  if (!redis.ok()) return redis.status();
  return NewRedisDriver(*std::move(redis));
}

absl::StatusOr<Stores> OpenRedisStores(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<RedisOptions> redis = Redis(text, o);
  if (!redis.ok()) return redis.status();
  absl::StatusOr<std::shared_ptr<DeadLetterStore>> dl = NewRedisDeadLetterStore(*redis);
  if (!dl.ok()) return dl.status();
  absl::StatusOr<std::shared_ptr<IdempotencyStore>> idem = NewRedisIdempotencyStore(*redis);
  if (!idem.ok()) return idem.status();
  return Stores{*std::move(dl), *std::move(idem)};
}

absl::StatusOr<std::shared_ptr<Driver>> OpenNsq(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  absl::StatusOr<NsqOptions> nsq = NsqOptionsFromUrl(*url, EnvOf(o));
  if (!nsq.ok()) return nsq.status();
  if (o.clock != nullptr) nsq->clock = o.clock;
  if (o.logger != nullptr) nsq->logger = o.logger;
  return NewNsqDriver(*std::move(nsq));
}

absl::StatusOr<std::shared_ptr<Driver>> OpenKafka(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  absl::StatusOr<KafkaOptions> kafka = KafkaOptionsFromUrl(*url, EnvOf(o));
  if (!kafka.ok()) return kafka.status();
  if (o.clock != nullptr) kafka->clock = o.clock;
  if (o.logger != nullptr) kafka->logger = o.logger;
  return NewKafkaDriver(*std::move(kafka));
}

absl::StatusOr<std::shared_ptr<Driver>> OpenNats(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  absl::StatusOr<NatsOptions> nats = NatsOptionsFromUrl(*url, EnvOf(o));
  if (!nats.ok()) return nats.status();
  if (o.clock != nullptr) nats->clock = o.clock;
  return NewNatsDriver(*std::move(nats));
}

absl::StatusOr<std::shared_ptr<Driver>> OpenRabbitMq(absl::string_view text,
                                                     const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  absl::StatusOr<RabbitMqOptions> rabbit = RabbitMqOptionsFromUrl(*url, EnvOf(o));
  if (!rabbit.ok()) return rabbit.status();
  if (o.clock != nullptr) rabbit->clock = o.clock;
  if (o.logger != nullptr) rabbit->logger = o.logger;
  return NewRabbitMqDriver(*std::move(rabbit));
}

absl::StatusOr<Stores> OpenSqliteStores(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
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
  return Stores{*std::move(dl), *std::move(idem)};
}

// libpq parses these URLs (postgres_url.h): the generic parser would refuse some of its forms.
absl::StatusOr<PostgresUrlOptions> Postgres(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<PostgresUrlOptions> pg = PostgresOptionsFromUrl(text);
  if (!pg.ok()) return pg.status();
  if (o.clock != nullptr) pg->db.clock = o.clock;
  return pg;
}

absl::StatusOr<std::shared_ptr<Driver>> OpenPostgres(absl::string_view text,
                                                     const OpenOverrides& o) {
  // The driver's tables live in the database's schema, as the stores' do.
  absl::StatusOr<PostgresUrlOptions> pg = Postgres(text, o);
  if (!pg.ok()) return pg.status();
  absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(pg->db);
  if (!driver.ok()) return driver.status();
  return std::shared_ptr<Driver>(*std::move(driver));
}

absl::StatusOr<Stores> OpenPostgresStores(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<PostgresUrlOptions> pg = Postgres(text, o);
  if (!pg.ok()) return pg.status();
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

// What each scheme opens: a driver, stores, or both (null: not that kind). A new backend adds
// its schemes here.
struct Opener {
  absl::string_view scheme;
  absl::StatusOr<std::shared_ptr<Driver>> (*driver)(absl::string_view, const OpenOverrides&);
  absl::StatusOr<Stores> (*stores)(absl::string_view, const OpenOverrides&);
};

constexpr Opener kOpeners[] = {
    {"memory", OpenMemory, OpenMemoryStores},
    {"redis", OpenRedis, OpenRedisStores},
    {"rediss", OpenRedis, OpenRedisStores},
    {"redis+cluster", OpenRedis, OpenRedisStores},
    {"rediss+cluster", OpenRedis, OpenRedisStores},
    {"redis+sentinel", OpenRedis, OpenRedisStores},
    {"rediss+sentinel", OpenRedis, OpenRedisStores},
    {"redis+unix", OpenRedis, OpenRedisStores},
    {"unix", OpenRedis, OpenRedisStores},
    {"nsq", OpenNsq, nullptr},
    {"nats", OpenNats, nullptr},
    {"tls", OpenNats, nullptr},
    {"amqp", OpenRabbitMq, nullptr},
    {"amqps", OpenRabbitMq, nullptr},
    {"kafka", OpenKafka, nullptr},
    {"sqlite", nullptr, OpenSqliteStores},
    {"postgres", OpenPostgres, OpenPostgresStores},
    {"postgresql", OpenPostgres, OpenPostgresStores},
};

// The schemes that open a driver (want_driver) or stores, for the error that names them.
std::string Schemes(bool want_driver) {
  std::vector<absl::string_view> names;
  for (const Opener& op : kOpeners) {
    if (want_driver ? op.driver != nullptr : op.stores != nullptr) names.push_back(op.scheme);
  }
  return absl::StrJoin(names, ", ");
}

// The opener of `text`'s scheme; InvalidArgument when the URL has none or an unknown one.
absl::StatusOr<const Opener*> Find(absl::string_view text, bool want_driver) {
  const std::string scheme = UrlScheme(text);
  if (scheme.empty()) {
    absl::StatusOr<ParsedUrl> url = ParseUrl(text);  // says what is wrong with it
    if (!url.ok()) return url.status();
  }
  for (const Opener& op : kOpeners) {
    if (op.scheme != scheme) continue;
    if (want_driver ? op.driver == nullptr : op.stores == nullptr) break;
    return &op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("URL scheme: \"", scheme, "\" is not one of ", Schemes(want_driver)));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Driver>> OpenDriver(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<const Opener*> op = Find(text, /*want_driver=*/true);
  if (!op.ok()) return op.status();
  WarnDeprecated(text, o);
  return (*op)->driver(text, o);
}

absl::StatusOr<Stores> OpenStores(absl::string_view text, const OpenOverrides& o) {
  absl::StatusOr<const Opener*> op = Find(text, /*want_driver=*/false);
  if (!op.ok()) return op.status();
  WarnDeprecated(text, o);
  return (*op)->stores(text, o);
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
