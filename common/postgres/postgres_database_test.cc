#include "common/postgres/postgres_database.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/postgres/internal/connection.h"
#include "common/postgres/internal/engine.h"
#include "common/postgres/internal/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/postgres_server.h"

namespace bus {
namespace {

using pg_internal::Connection;
using pg_internal::Param;
using pg_internal::Result;
using pg_internal::Statement;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::PostgresServer;

class PostgresDatabaseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<PostgresServer>> s = PostgresServer::Start({});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  // Options on a schema of this test's own.
  PostgresOptions Options() {
    static std::atomic<int> n{0};
    PostgresOptions o;
    o.conninfo = server_->Url();
    o.schema = absl::StrCat("t", n.fetch_add(1));
    return o;
  }

  std::shared_ptr<PostgresDatabase> Open(PostgresOptions o) {
    absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(std::move(o));
    EXPECT_TRUE(db.ok()) << db.status();
    return db.ok() ? *db : nullptr;
  }

  // One statement's first column, as text.
  static absl::StatusOr<std::vector<std::string>> Column(PostgresDatabase& db,
                                                         const std::string& sql) {
    const Statement s{&sql};
    absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(db).Run({&s, 1});
    if (!r.ok()) return r.status();
    std::vector<std::string> out;
    for (int i = 0; i < (*r)[0].rows(); ++i) out.emplace_back((*r)[0].Bytes(i, 0));
    return out;
  }

  static PostgresServer* server_;
};

PostgresServer* PostgresDatabaseTest::server_ = nullptr;

TEST_F(PostgresDatabaseTest, OpenConnectsToNothingAndTheFirstCallMigrates) {
  PostgresOptions o = Options();
  o.conninfo = "postgres://nobody:pw@127.0.0.1:1/none";
  ASSERT_NE(Open(o), nullptr);  // nothing listens on port 1, and Open does not care

  PostgresOptions good = Options();
  std::shared_ptr<PostgresDatabase> db = Open(good);
  ASSERT_TRUE(db->Ping(absl::Seconds(30)).ok());
  ASSERT_TRUE(db->Migrate().ok());
  absl::StatusOr<std::vector<std::string>> tables =
      Column(*db, absl::StrCat("SELECT tablename::text FROM pg_tables WHERE schemaname = '",
                               good.schema, "' ORDER BY tablename"));
  ASSERT_TRUE(tables.ok()) << tables.status();
  EXPECT_THAT(*tables, ElementsAre("bus_meta", "dead_letters", "idempotency_keys", "outbox",
                                   "queue_bindings", "queue_messages", "queues"));
  EXPECT_THAT(*Column(*db, db->Sql(pg_internal::kSchemaVersionSql)),
              ElementsAre(absl::StrCat(PostgresDatabase::kSchemaVersion)));
  // A second database object (another process) finds it migrated.
  std::shared_ptr<PostgresDatabase> again = Open(good);
  EXPECT_TRUE(again->Migrate().ok());
}

TEST_F(PostgresDatabaseTest, ProcessesMigratingTogetherSerializeOnTheAdvisoryLock) {
  PostgresOptions o = Options();
  std::vector<std::shared_ptr<PostgresDatabase>> dbs;
  for (int i = 0; i < 4; ++i) dbs.push_back(Open(o));
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(dbs.size());
  for (size_t i = 0; i < dbs.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = dbs[i]->Migrate(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  EXPECT_THAT(*Column(*dbs[0], dbs[0]->Sql(pg_internal::kSchemaVersionSql)),
              ElementsAre(absl::StrCat(PostgresDatabase::kSchemaVersion)));
}

TEST_F(PostgresDatabaseTest, AnOldSchemaIsUpgradedInPlaceKeepingItsRows) {
  PostgresOptions o = Options();
  const std::string q = pg_internal::QuoteIdentifier(o.schema);
  // A schema as version 1 left it, with a key and a letter in it.
  std::string v1 = absl::StrCat("CREATE SCHEMA ", q, ";",
                                pg_internal::WithSchema(pg_internal::kCreateMetaTableSql, q), ";");
  for (const char* s : pg_internal::kMigrationV1) {
    absl::StrAppend(&v1, pg_internal::WithSchema(s, q), ";");
  }
  absl::StrAppend(&v1, "INSERT INTO ", q, ".bus_meta VALUES ('schema_version', '1');",
                  "INSERT INTO ", q,
                  ".idempotency_keys VALUES ('\\x6b'::bytea, 'o'::bytea, true, now() + interval "
                  "'1 hour');",
                  "INSERT INTO ", q,
                  ".dead_letters (queue, data, reason, kind, attempts, first_failed_at, "
                  "last_failed_at, replays) VALUES ('q', 'd', 'r', 2, 1, now(), now(), 0);");
  ASSERT_TRUE(server_->Exec(v1).ok());

  std::shared_ptr<PostgresDatabase> db = Open(o);
  ASSERT_TRUE(db->Migrate().ok());
  EXPECT_THAT(*Column(*db, db->Sql(pg_internal::kSchemaVersionSql)),
              ElementsAre(absl::StrCat(PostgresDatabase::kSchemaVersion)));
  EXPECT_THAT(*Column(*db, db->Sql("SELECT count(*)::text FROM {schema}.idempotency_keys")),
              ElementsAre("1"));
  EXPECT_THAT(*Column(*db, db->Sql("SELECT queue FROM {schema}.dead_letters")), ElementsAre("q"));
  EXPECT_THAT(
      *Column(*db, absl::StrCat("SELECT indexname::text FROM pg_indexes WHERE "
                                "schemaname = '",
                                o.schema, "' AND indexname LIKE '%_by_%' ORDER BY 1")),
      ElementsAre("dead_letters_by_kind", "dead_letters_by_message", "dead_letters_by_queue",
                  "idempotency_keys_by_expiry", "queue_messages_by_due"));
}

TEST_F(PostgresDatabaseTest, ANewerSchemaIsRefused) {
  PostgresOptions o = Options();
  std::shared_ptr<PostgresDatabase> db = Open(o);
  ASSERT_TRUE(db->Migrate().ok());
  ASSERT_TRUE(server_
                  ->Exec(db->Sql("UPDATE {schema}.bus_meta SET value = '99' WHERE name = "
                                 "'schema_version'"))
                  .ok());
  absl::Status st = Open(o)->Migrate();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("version 99"));
}

TEST_F(PostgresDatabaseTest, ConnectionStringsGoThroughLibpqAndPasswordsAreNeverShown) {
  PostgresOptions o = Options();
  o.conninfo = absl::StrCat("host=127.0.0.1 port=", server_->port(),
                            " user=bus_admin password=admin-secret dbname=postgres");
  std::shared_ptr<PostgresDatabase> db = Open(o);
  EXPECT_TRUE(db->Ping(absl::Seconds(30)).ok());
  EXPECT_EQ(
      db->redacted(),
      absl::StrCat("postgres://bus_admin:<redacted>@127.0.0.1:", server_->port(), "/postgres"));
  PostgresOptions uri = Options();
  uri.conninfo = absl::StrCat("postgresql://bus_admin:admin-secret@127.0.0.1:", server_->port(),
                              "/postgres?sslmode=disable");
  std::shared_ptr<PostgresDatabase> by_uri = Open(uri);
  EXPECT_TRUE(by_uri->Ping(absl::Seconds(30)).ok());
  EXPECT_THAT(by_uri->redacted(), Not(HasSubstr("admin-secret")));
  EXPECT_THAT(by_uri->redacted(), HasSubstr("?sslmode=disable"));

  PostgresOptions wrong = Options();
  wrong.conninfo = absl::StrReplaceAll(server_->Url(), {{"admin-secret", "wrong-secret"}});
  absl::Status st = Open(wrong)->Ping(absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.ToString(), Not(HasSubstr("wrong-secret")));

  PostgresOptions none = Options();
  none.conninfo = absl::StrCat("postgres://bus_admin@127.0.0.1:", server_->port(), "/postgres");
  st = Open(none)->Ping(absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;

  PostgresOptions bad = Options();
  bad.conninfo = "postgres://u:top%zzsecret@host/db";
  absl::StatusOr<std::shared_ptr<PostgresDatabase>> refused = PostgresDatabase::Open(bad);
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().ToString(), Not(HasSubstr("secret")));
}

TEST_F(PostgresDatabaseTest, BadOptionsNameTheirField) {
  PostgresOptions o = Options();
  o.schema = "Bad-Name";
  EXPECT_THAT(ValidatePostgresOptions(o).message(), HasSubstr("PostgresOptions.schema"));
  o = Options();
  o.max_connections = 0;
  EXPECT_THAT(ValidatePostgresOptions(o).message(), HasSubstr("max_connections"));
  o = Options();
  o.timeouts.request = absl::ZeroDuration();
  EXPECT_THAT(ValidatePostgresOptions(o).message(), HasSubstr("timeouts.request"));
}

TEST_F(PostgresDatabaseTest, SqlstatesMapToStatusCodes) {
  std::shared_ptr<PostgresDatabase> db = Open(Options());
  const auto raise = [&](absl::string_view code) {
    return Column(*db, absl::StrCat("DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = '", code,
                                    "'; END $$"))
        .status();
  };
  EXPECT_TRUE(absl::IsUnavailable(raise("08006")));
  EXPECT_TRUE(absl::IsUnauthenticated(raise("28000")));
  EXPECT_TRUE(absl::IsPermissionDenied(raise("42501")));
  EXPECT_TRUE(absl::IsDeadlineExceeded(raise("57014")));
  EXPECT_TRUE(absl::IsInvalidArgument(raise("22023")));
  EXPECT_TRUE(absl::IsFailedPrecondition(raise("55000")));
  absl::Status st = raise("XX000");
  EXPECT_TRUE(absl::IsInternal(st));
  EXPECT_THAT(st.message(), HasSubstr("SQLSTATE XX000"));
  EXPECT_THAT(st.message(), HasSubstr("<redacted>"));

  // A real permission failure: a role without rights on the tables.
  ASSERT_TRUE(server_->Exec("CREATE ROLE reader LOGIN PASSWORD 'reader-pw'").ok());
  PostgresOptions as_reader = Options();
  ASSERT_TRUE(Open(as_reader)->Migrate().ok());
  as_reader.conninfo =
      absl::StrCat("postgres://reader:reader-pw@127.0.0.1:", server_->port(), "/postgres");
  std::shared_ptr<PostgresDatabase> reader = Open(as_reader);
  st = Column(*reader, reader->Sql("SELECT count(*) FROM {schema}.dead_letters")).status();
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
}

TEST_F(PostgresDatabaseTest, TheStatementTimeoutBoundsEveryCall) {
  PostgresOptions o = Options();
  o.timeouts.request = absl::Milliseconds(200);
  std::shared_ptr<PostgresDatabase> db = Open(o);
  ASSERT_TRUE(db->Migrate().ok());
  absl::Status st = Column(*db, "SELECT pg_sleep(30)::text").status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_TRUE(db->Ping(absl::Seconds(30)).ok());  // the connection is still good
}

TEST_F(PostgresDatabaseTest, SerializationFailuresAreRetriedInsideTheLibrary) {
  PostgresOptions o = Options();
  o.max_retries = 3;
  std::shared_ptr<PostgresDatabase> db = Open(o);
  int runs = 0;
  const std::string fail = "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$";
  const std::string ok = "SELECT 1";
  absl::Status st = pg_internal::Engine(*db).WithConnection([&](Connection& c) {
    const Statement s{++runs < 3 ? &fail : &ok};
    return c.Pipeline({&s, 1}, pg_internal::Engine(*db).Deadline(1)).status();
  });
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(db->stats().retries, 2);

  runs = 0;
  const std::string deadlock =
      "DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$";
  st = pg_internal::Engine(*db).WithConnection([&](Connection& c) {
    ++runs;
    const Statement s{&deadlock};
    return c.Pipeline({&s, 1}, pg_internal::Engine(*db).Deadline(1)).status();
  });
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_EQ(runs, 4);  // the first run and max_retries more
}

TEST_F(PostgresDatabaseTest, ThePoolIsBounded) {
  PostgresOptions o = Options();
  o.max_connections = 1;
  o.pool_timeout = absl::Milliseconds(100);
  std::shared_ptr<PostgresDatabase> db = Open(o);
  absl::Status inner;
  absl::Status outer = pg_internal::Engine(*db).WithConnection([&](Connection&) {
    inner = db->Ping(absl::Milliseconds(100));
    return absl::OkStatus();
  });
  EXPECT_TRUE(outer.ok()) << outer;
  EXPECT_TRUE(absl::IsUnavailable(inner)) << inner;
  EXPECT_THAT(inner.message(), HasSubstr("all 1 connections"));
  EXPECT_EQ(db->stats().open_connections, 1);
  EXPECT_TRUE(db->Ping(absl::Seconds(30)).ok());
}

TEST_F(PostgresDatabaseTest, ParametersAndBinaryResultsRoundTrip) {
  std::shared_ptr<PostgresDatabase> db = Open(Options());
  const std::string sql = "SELECT $1::bytea, $2::bigint, $3::timestamptz, $4::bytea IS NULL";
  const std::string bytes("\0\xff\x01 x", 5);
  const absl::Time t = absl::FromUnixMicros(1700000000123456);
  const Statement s{&sql, {Param::Bytes(bytes), Param::Int(-42), Param::Time(t), Param::Null()}};
  absl::StatusOr<std::vector<Result>> r = pg_internal::Engine(*db).Run({&s, 1});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].Bytes(0, 0), bytes);
  EXPECT_EQ((*r)[0].Int(0, 1), -42);
  EXPECT_EQ((*r)[0].Time(0, 2), t);
  EXPECT_TRUE((*r)[0].Bool(0, 3));
}

// Statements with `prepare` are parsed once per connection (a text twice in one round trip
// once); a prepare that fails is not remembered; `failed_at` names the failed statement.
TEST_F(PostgresDatabaseTest, PreparedStatementsAndTheFailedStatementsIndex) {
  std::shared_ptr<PostgresDatabase> db = Open(Options());
  const std::string add = "SELECT $1::bigint + 1";
  const std::string bad = "SELEKT 1";
  const std::string count =
      "SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT $1::bigint + 1'";
  absl::Status st = pg_internal::Engine(*db).WithConnection([&](Connection& c) -> absl::Status {
    const std::vector<Statement> twice = {
        {&add, {Param::Int(1)}, false, true}, {&add, {Param::Int(41)}, false, true}, {&count}};
    for (int round = 0; round < 2; ++round) {
      absl::StatusOr<std::vector<Result>> r =
          c.Pipeline(twice, pg_internal::Engine(*db).Deadline(twice.size()));
      if (!r.ok()) return r.status();
      EXPECT_EQ((*r)[0].Int(0, 0), 2);
      EXPECT_EQ((*r)[1].Int(0, 0), 42);
      EXPECT_EQ((*r)[2].Int(0, 0), 1) << "round " << round;
    }
    const std::vector<Statement> failing = {{&add, {Param::Int(1)}, false, true},
                                            {&bad, {}, false, true}};
    for (int round = 0; round < 2; ++round) {
      size_t failed_at = 99;
      absl::StatusOr<std::vector<Result>> r =
          c.Pipeline(failing, pg_internal::Engine(*db).Deadline(failing.size()), &failed_at);
      EXPECT_FALSE(r.ok());
      EXPECT_EQ(failed_at, 1u) << "round " << round;
    }
    absl::StatusOr<std::vector<Result>> ok =
        c.Pipeline({&failing[0], 1}, pg_internal::Engine(*db).Deadline(1));
    return ok.status();
  });
  EXPECT_TRUE(st.ok()) << st;
}

// A server of its own: restarted under the database's connections.
TEST(PostgresDatabaseRestartTest, ConnectionsAreReplacedAfterTheServerRestarts) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  PostgresOptions o;
  o.conninfo = (*server)->Url();
  o.max_connections = 2;
  absl::StatusOr<std::shared_ptr<PostgresDatabase>> db = PostgresDatabase::Open(o);
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->Migrate().ok());
  ASSERT_TRUE((*db)->Ping(absl::Seconds(30)).ok());
  for (PostgresServer::Shutdown how :
       {PostgresServer::Shutdown::kFast, PostgresServer::Shutdown::kImmediate}) {
    ASSERT_TRUE((*server)->Restart(how).ok());
    // The idle connection the server closed is noticed before use: no call fails.
    EXPECT_TRUE((*db)->Ping(absl::Seconds(30)).ok());
    EXPECT_TRUE((*db)->Migrate().ok());
  }
  EXPECT_GE((*db)->stats().discarded, 2);

  // While the server is down, calls fail with Unavailable; once it is back, they succeed.
  ASSERT_TRUE((*server)->Stop().ok());
  absl::Status down = (*db)->Ping(absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnavailable(down)) << down;
  EXPECT_THAT(down.ToString(), Not(HasSubstr("admin-secret")));
  ASSERT_TRUE((*server)->Restart().ok());
  EXPECT_TRUE((*db)->Ping(absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace bus
