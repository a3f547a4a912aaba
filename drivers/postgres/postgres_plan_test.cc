// The reservation stays O(log n) however many rows a queue holds: with a million delayed rows
// (older, lower ids) and a million ready ones in the queue, the reserve statement and the
// settles of several deliveries touch a number of pages that depends on the rows they change,
// not on the table, in the generic plan that a prepared statement may switch to and in the
// custom plan. Counted in buffers (EXPLAIN ANALYZE), not timed.

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "drivers/postgres/internal/queue_sql.h"
#include "drivers/postgres/postgres_driver.h"
#include "gtest/gtest.h"
#include "tests/testing/postgres_server.h"

namespace bus::testing {
namespace {

// The shared buffers the plan's top node touched ("Buffers: shared hit=12 read=3"), or -1.
int64_t Buffers(const std::vector<std::string>& plan) {
  for (const std::string& line : plan) {
    const size_t at = line.find("Buffers: shared");
    if (at == std::string::npos) continue;
    int64_t total = 0;
    for (const char* kind : {"hit=", "read=", "dirtied=", "written="}) {
      const size_t k = line.find(kind, at);
      if (k == std::string::npos) continue;
      int64_t n = 0;
      const std::string digits =
          line.substr(k + strlen(kind), line.find(' ', k) - k - strlen(kind));
      if (absl::SimpleAtoi(digits, &n)) total += n;
    }
    return total;
  }
  return -1;
}

TEST(PostgresPlanTest, ReservationReadsAFewPagesBehindTwoMillionRows) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> server = PostgresServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  PostgresOptions db;
  db.conninfo = (*server)->Url();
  db.schema = "plan";
  absl::StatusOr<std::shared_ptr<PostgresDriver>> driver = NewPostgresDriver(db);
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->database()->Migrate().ok());
  ASSERT_TRUE(
      (*server)
          ->Exec("INSERT INTO plan.queue_messages (queue, payload, due_at) "
                 "SELECT 'q', 'x', now() + interval '1 hour' FROM generate_series(1, 1000000); "
                 "INSERT INTO plan.queue_messages (queue, payload, due_at) "
                 "SELECT 'q', 'x', now() - interval '1 second' FROM generate_series(1, 1000000); "
                 "ANALYZE plan.queue_messages")
          .ok());
  const auto sql = [&](const char* text) {
    return absl::StrReplaceAll(std::string(text), {{"{schema}", "plan"}});
  };
  // Each statement prepared and explained (so run) on a session of its own; the settles on
  // leased rows near the end of the key, different ones each time.
  int64_t next_id = 1999901;
  for (const char* mode : {"force_generic_plan", "force_custom_plan"}) {
    SCOPED_TRACE(mode);
    absl::StatusOr<std::vector<std::string>> plan = (*server)->Exec(absl::StrCat(
        "SET plan_cache_mode = ", mode, "; PREPARE reserve(text, bigint, bigint, bigint) AS ",
        sql(pg_internal::kReserveSql),
        "; EXPLAIN (ANALYZE, BUFFERS) EXECUTE reserve('q', 64, 1, 30000000)"));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t reserve_buffers = Buffers(*plan);
    std::cout << mode << " reserve: " << reserve_buffers << " buffers" << std::endl;
    EXPECT_GT(reserve_buffers, 0) << absl::StrJoin(*plan, "\n");
    // About 14 per leased row (its new version and two index entries): 900 for 64 rows. A plan
    // that reads the primary key from its start touches 28,000 here, growing with the table.
    EXPECT_LT(reserve_buffers, 2000) << absl::StrJoin(*plan, "\n");
    for (const char* settle : {pg_internal::kAckManySql, pg_internal::kNackSql}) {
      const bool nack = settle == pg_internal::kNackSql;
      const std::string ids = absl::StrCat("{", next_id, ",", next_id + 1, ",", next_id + 2, "}");
      next_id += 3;
      absl::StatusOr<std::vector<std::string>> p = (*server)->Exec(
          absl::StrCat("SET plan_cache_mode = ", mode, "; PREPARE settle(bigint[], bigint[]",
                       nack ? ", bigint, text" : "", ") AS ", sql(settle),
                       "; EXPLAIN (ANALYZE, BUFFERS) EXECUTE settle('", ids, "', '{7,7,7}'",
                       nack ? ", 0, 'plan'" : "", ")"));
      ASSERT_TRUE(p.ok()) << p.status();
      const int64_t settle_buffers = Buffers(*p);
      EXPECT_GT(settle_buffers, 0) << absl::StrJoin(*p, "\n");
      EXPECT_LT(settle_buffers, 200) << absl::StrJoin(*p, "\n");
      std::cout << mode << (nack ? " nack" : " ack many") << ": " << settle_buffers << " buffers"
                << std::endl;
    }
  }
}

}  // namespace
}  // namespace bus::testing
