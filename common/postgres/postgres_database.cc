#include "common/postgres/postgres_database.h"

#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/schema.h"

namespace bus {
namespace pg_internal {

std::string WithSchema(absl::string_view sql, absl::string_view quoted_schema) {
  return absl::StrReplaceAll(sql, {{"{schema}", quoted_schema}});
}

}  // namespace pg_internal

namespace {

using pg_internal::Connection;
using pg_internal::Param;
using pg_internal::Result;
using pg_internal::Statement;

bool ValidSchemaName(absl::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  if (!(absl::ascii_islower(s[0]) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_')) return false;
  }
  return true;
}

// libpq's parse error with any quoted part of the input hidden (it may be a password).
std::string HideQuoted(absl::string_view message) {
  std::string out;
  bool in_quote = false;
  for (char c : absl::StripAsciiWhitespace(message)) {
    if (c == '"') {
      if (!in_quote) out += "\"<redacted>\"";
      in_quote = !in_quote;
      continue;
    }
    if (!in_quote) out += c;
  }
  return out;
}

struct ParsedConninfo {
  std::vector<std::pair<std::string, std::string>> params;
  std::string redacted;
};

absl::StatusOr<ParsedConninfo> ParseConninfo(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (opts == nullptr) {
    const std::string why = err != nullptr ? HideQuoted(err) : "out of memory";
    PQfreemem(err);
    return absl::InvalidArgumentError(
        absl::StrCat("PostgresOptions.conninfo: libpq cannot parse it: ", why));
  }
  ParsedConninfo out;
  std::string user, host, port, dbname, sslmode;
  bool password = false;
  for (PQconninfoOption* o = opts; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const std::string k = o->keyword;
    out.params.emplace_back(k, o->val);
    if (k == "user") user = o->val;
    if (k == "host") host = o->val;
    if (k == "hostaddr" && host.empty()) host = o->val;
    if (k == "port") port = o->val;
    if (k == "dbname") dbname = o->val;
    if (k == "sslmode") sslmode = o->val;
    if (k == "password") password = true;
  }
  PQconninfoFree(opts);
  out.redacted = absl::StrCat("postgres://", user, password ? ":<redacted>" : "",
                              user.empty() && !password ? "" : "@", host, port.empty() ? "" : ":",
                              port, "/", dbname, sslmode.empty() ? "" : "?sslmode=", sslmode);
  return out;
}

}  // namespace

absl::Status ValidatePostgresOptions(const PostgresOptions& o) {
  if (absl::StatusOr<ParsedConninfo> p = ParseConninfo(o.conninfo); !p.ok()) return p.status();
  if (!ValidSchemaName(o.schema)) {
    return absl::InvalidArgumentError(
        "PostgresOptions.schema: must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 63 "
        "bytes)");
  }
  if (o.max_connections < 1) {
    return absl::InvalidArgumentError("PostgresOptions.max_connections: must be >= 1");
  }
  if (o.pool_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PostgresOptions.pool_timeout: must be > 0");
  }
  if (o.timeouts.connect <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PostgresOptions.timeouts.connect: must be > 0");
  }
  if (o.timeouts.request < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("PostgresOptions.timeouts.request: must be >= 1ms");
  }
  if (o.max_retries < 0) {
    return absl::InvalidArgumentError("PostgresOptions.max_retries: must be >= 0");
  }
  if (o.retry_backoff.initial < absl::ZeroDuration() ||
      o.retry_backoff.max < o.retry_backoff.initial) {
    return absl::InvalidArgumentError("PostgresOptions.retry_backoff: needs 0 <= initial <= max");
  }
  return absl::OkStatus();
}

struct PostgresDatabase::Impl {
  PostgresOptions options;
  pg_internal::ConnectSpec spec;
  std::string quoted_schema;

  mutable absl::Mutex mu;
  std::vector<std::unique_ptr<Connection>> idle ABSL_GUARDED_BY(mu);
  int open ABSL_GUARDED_BY(mu) = 0;
  int64_t connects ABSL_GUARDED_BY(mu) = 0;
  int64_t discarded ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int64_t> retries{0};
  std::atomic<int64_t> round_trips{0};

  absl::Mutex migrate_mu;
  std::atomic<bool> migrated{false};

  // A connection: an idle one that is still good, else a new one while fewer than
  // max_connections are open, else the first one given back before `deadline`.
  absl::StatusOr<std::unique_ptr<Connection>> Take(absl::Time deadline) {
    absl::MutexLock lock(&mu);
    while (true) {
      while (!idle.empty()) {
        std::unique_ptr<Connection> c = std::move(idle.back());
        idle.pop_back();
        if (!c->Stale()) return c;
        --open;
        ++discarded;
      }
      if (open < options.max_connections) {
        ++open;
        ++connects;
        mu.Unlock();
        absl::StatusOr<std::unique_ptr<Connection>> c = Connection::Open(spec);
        mu.Lock();
        if (!c.ok()) --open;
        return c;
      }
      const auto can_take = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return !idle.empty() || open < options.max_connections;
      };
      if (!options.clock->AwaitWithDeadline(&mu, absl::Condition(&can_take), deadline)) {
        return absl::UnavailableError(absl::StrCat(
            "PostgreSQL: all ", options.max_connections,
            " connections of the pool stayed busy for pool_timeout [", spec.redacted, "]"));
      }
    }
  }

  void Give(std::unique_ptr<Connection> c) {
    absl::MutexLock lock(&mu);
    if (c->broken()) {
      --open;
      ++discarded;
      return;
    }
    idle.push_back(std::move(c));
  }
};

PostgresDatabase::PostgresDatabase(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PostgresDatabase::~PostgresDatabase() = default;

absl::StatusOr<std::shared_ptr<PostgresDatabase>> PostgresDatabase::Open(PostgresOptions options) {
  if (absl::Status st = ValidatePostgresOptions(options); !st.ok()) return st;
  absl::StatusOr<ParsedConninfo> parsed = ParseConninfo(options.conninfo);
  if (!parsed.ok()) return parsed.status();
  if (options.clock == nullptr) options.clock = RealClock();
  auto impl = std::make_unique<Impl>();
  impl->spec.params = std::move(parsed->params);
  impl->spec.redacted = std::move(parsed->redacted);
  impl->spec.connect_timeout = options.timeouts.connect;
  impl->spec.statement_timeout = options.timeouts.request;
  impl->quoted_schema = pg_internal::QuoteIdentifier(options.schema);
  impl->options = std::move(options);
  return std::shared_ptr<PostgresDatabase>(new PostgresDatabase(std::move(impl)));
}

const PostgresOptions& PostgresDatabase::options() const { return impl_->options; }
const std::string& PostgresDatabase::redacted() const { return impl_->spec.redacted; }

std::string PostgresDatabase::Sql(absl::string_view sql) const {
  return pg_internal::WithSchema(sql, impl_->quoted_schema);
}

absl::Time PostgresDatabase::Deadline(size_t statements) const {
  // Real time: the bound on the server's answer over the network.
  return absl::Now() + impl_->options.timeouts.request * static_cast<double>(statements + 1);
}

PostgresDatabase::Stats PostgresDatabase::stats() const {
  absl::MutexLock lock(&impl_->mu);
  Stats s;
  s.open_connections = impl_->open;
  s.idle_connections = static_cast<int>(impl_->idle.size());
  s.connects = impl_->connects;
  s.discarded = impl_->discarded;
  s.retries = impl_->retries.load();
  s.round_trips = impl_->round_trips.load();
  return s;
}

absl::Status PostgresDatabase::WithConnection(
    absl::FunctionRef<absl::Status(pg_internal::Connection&)> op) {
  Backoff backoff(impl_->options.retry_backoff);
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<std::unique_ptr<Connection>> conn =
        impl_->Take(impl_->options.clock->Now() + impl_->options.pool_timeout);
    if (!conn.ok()) return conn.status();
    absl::Status st = EnsureMigrated(**conn);
    if (st.ok()) st = op(**conn);
    impl_->Give(*std::move(conn));
    if (!absl::IsAborted(st) || attempt >= impl_->options.max_retries) return st;
    impl_->retries.fetch_add(1);
    SleepAfterFailure(*impl_->options.clock, backoff);
  }
}

absl::StatusOr<std::vector<Result>> PostgresDatabase::Run(absl::Span<const Statement> statements) {
  std::vector<Result> out;
  absl::Status st = WithConnection([&](Connection& c) {
    impl_->round_trips.fetch_add(1);
    absl::StatusOr<std::vector<Result>> r = c.Pipeline(statements, Deadline(statements.size()));
    if (!r.ok()) return r.status();
    out = *std::move(r);
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::unique_ptr<Connection>> PostgresDatabase::OpenSession() {
  if (absl::Status st = Migrate(); !st.ok()) return st;
  return Connection::Open(impl_->spec);
}

absl::Status PostgresDatabase::Migrate() {
  return WithConnection([](Connection&) { return absl::OkStatus(); });
}

absl::Status PostgresDatabase::Ping(absl::Duration timeout) {
  // Real time: a health check's bound on the network round trip.
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::unique_ptr<Connection>> conn = impl_->Take(deadline);
  if (!conn.ok()) return conn.status();
  static const std::string* const kSelectOne = new std::string("SELECT 1");
  const Statement stmt{kSelectOne};
  absl::StatusOr<std::vector<Result>> r = (*conn)->Pipeline({&stmt, 1}, deadline);
  impl_->Give(*std::move(conn));
  return r.status();
}

absl::Status PostgresDatabase::EnsureMigrated(Connection& conn) {
  if (impl_->migrated.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&impl_->migrate_mu);
  if (impl_->migrated.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::Status st = MigrateOn(conn);
  if (st.ok()) impl_->migrated.store(true, std::memory_order_release);
  return st;
}

absl::Status PostgresDatabase::MigrateOn(Connection& conn) {
  static const auto* const kBegin = new std::string("BEGIN");
  static const auto* const kCommit = new std::string("COMMIT");
  static const auto* const kRollback = new std::string("ROLLBACK");
  // One lock per schema, across every process on the database, for the transaction.
  static const auto* const kLock =
      new std::string("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))");
  static const auto* const kSchemaExists =
      new std::string("SELECT count(*) FROM pg_namespace WHERE nspname = $1");
  static const auto* const kMetaExists = new std::string(
      "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
      "WHERE n.nspname = $1 AND c.relname = 'bus_meta'");
  const std::string& schema = impl_->options.schema;
  const auto rollback = [&](absl::Status why) {
    if (!conn.broken()) {
      const Statement r{kRollback};
      conn.Pipeline({&r, 1}, Deadline(1)).IgnoreError();
    }
    return why;
  };

  const std::vector<Statement> probe = {
      {kBegin},
      {kLock, {Param::Text(absl::StrCat("msgbus.schema:", schema))}},
      {kSchemaExists, {Param::Text(schema)}},
      {kMetaExists, {Param::Text(schema)}},
  };
  absl::StatusOr<std::vector<Result>> r = conn.Pipeline(probe, Deadline(probe.size()));
  if (!r.ok()) return rollback(r.status());
  const bool have_schema = (*r)[2].Int(0, 0) > 0;
  const bool have_meta = (*r)[3].Int(0, 0) > 0;
  int version = 0;
  if (have_meta) {
    const std::string sql = Sql(pg_internal::kSchemaVersionSql);
    const Statement get{&sql};
    absl::StatusOr<std::vector<Result>> v = conn.Pipeline({&get, 1}, Deadline(1));
    if (!v.ok()) return rollback(v.status());
    if ((*v)[0].rows() > 0 && !absl::SimpleAtoi((*v)[0].Bytes(0, 0), &version)) {
      return rollback(absl::FailedPreconditionError(
          absl::StrCat("PostgreSQL: schema ", schema, ": bus_meta holds a bad schema_version")));
    }
  }
  if (version > kSchemaVersion) {
    return rollback(absl::FailedPreconditionError(
        absl::StrCat("PostgreSQL: schema ", schema, " is at version ", version,
                     ", newer than this library's ", kSchemaVersion, " [", redacted(), "]")));
  }
  std::vector<std::string> sqls;
  if (!have_schema) sqls.push_back(absl::StrCat("CREATE SCHEMA ", impl_->quoted_schema));
  if (!have_meta) sqls.push_back(Sql(pg_internal::kCreateMetaTableSql));
  for (int v = version; v < kSchemaVersion; ++v) {
    for (const char* s : pg_internal::Migrations()[static_cast<size_t>(v)]) sqls.push_back(Sql(s));
  }
  const std::string set_version = Sql(pg_internal::kSetSchemaVersionSql);
  std::vector<Statement> apply;
  for (const std::string& s : sqls) apply.push_back({&s});
  if (version != kSchemaVersion) {
    apply.push_back({&set_version, {Param::Text(absl::StrCat(kSchemaVersion))}});
  }
  apply.push_back({kCommit});
  absl::StatusOr<std::vector<Result>> done = conn.Pipeline(apply, Deadline(apply.size()));
  if (!done.ok()) return rollback(done.status());
  return absl::OkStatus();
}

}  // namespace bus
