#include "bench/growth_fill.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "bench/redis_server_stats.h"
#include "common/sqlite/internal/dead_letter_sql.h"

namespace bus::growth {
namespace {

constexpr int64_t kRetentionMs = 24 * 3600 * 1000;

// One sqlite3 connection, closed on destruction.
class RawDb {
 public:
  ~RawDb() { sqlite3_close(db_); }
  absl::Status Open(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      return Error("open");
    }
    sqlite3_busy_timeout(db_, 30000);
    return absl::OkStatus();
  }
  absl::Status Exec(const char* sql) {
    return sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) == SQLITE_OK ? absl::OkStatus()
                                                                          : Error(sql);
  }
  // Runs `sql` once per call of bind(stmt, i) for i in [0, n), in one transaction.
  template <typename Bind>
  absl::Status InsertAll(const char* sql, uint64_t n, Bind bind) {
    if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) return Error(sql);
    for (uint64_t i = 0; i < n; ++i) {
      bind(stmt, i);
      const int rc = sqlite3_step(stmt);
      if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        sqlite3_finalize(stmt);
        return Error(sql);
      }
      sqlite3_reset(stmt);
    }
    sqlite3_finalize(stmt);
    if (absl::Status s = Exec("COMMIT"); !s.ok()) return s;
    return Exec("PRAGMA wal_checkpoint(TRUNCATE)");
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InternalError(absl::StrCat(what, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3* db_ = nullptr;
};

}  // namespace

std::string KeyOf(uint64_t series, uint64_t n) {
  return absl::StrCat("growth.", absl::Hex(series, absl::kZeroPad16),
                      absl::Hex(n, absl::kZeroPad16));
}

std::string OwnerOf(uint64_t n) {
  std::string s = absl::StrCat("owner", absl::Dec(n, absl::kZeroPad10));
  return s.substr(s.size() - 15);
}

DeadLetter LetterOf(const std::string& queue, uint64_t n, int payload) {
  const absl::Time now = absl::Now();
  return DeadLetter{.queue = queue,
                    .data = std::string(static_cast<size_t>(payload), 'x'),
                    .message_id = absl::StrCat(absl::Hex(0xfeed, absl::kZeroPad16),
                                               absl::Hex(n, absl::kZeroPad16)),
                    .reason = "handle: attempts exhausted: orders service unavailable",
                    .kind = DeadLetterKind::kExhausted,
                    .attempts = 5,
                    .first_failed_at = now - absl::Minutes(10),
                    .last_failed_at = now};
}

int64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (!absl::ConsumePrefix(&v, "VmRSS:")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, " kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(v, &kib)) return kib * 1024;
  }
  return -1;
}

int64_t SqliteFileBytes(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  int64_t total = st.st_size;
  if (stat((path + "-wal").c_str(), &st) == 0) total += st.st_size;
  return total;
}

absl::Status FillSqliteKeys(const std::string& path, uint64_t series, uint64_t from, uint64_t n) {
  RawDb db;
  if (absl::Status s = db.Open(path); !s.ok()) return s;
  const int64_t expiry = absl::ToUnixMillis(absl::Now()) + kRetentionMs;
  return db.InsertAll(
      "INSERT INTO idempotency_keys (key, owner, done, expires_at_ms) VALUES (?1, ?2, 1, ?3)", n,
      [&](sqlite3_stmt* stmt, uint64_t i) {
        const std::string key = KeyOf(series, from + i);
        const std::string owner = OwnerOf(from + i);
        sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
        sqlite3_bind_text(stmt, 2, owner.data(), static_cast<int>(owner.size()), SQLITE_TRANSIENT);
        sqlite3_bind_int64(stmt, 3, expiry);
      });
}

absl::Status FillSqliteLetters(const std::string& path, const std::string& queue, uint64_t n,
                               int payload) {
  RawDb db;
  if (absl::Status s = db.Open(path); !s.ok()) return s;
  return db.InsertAll(sqlite_internal::kStoreLetterSql, n, [&](sqlite3_stmt* stmt, uint64_t i) {
    const DeadLetter l = LetterOf(queue, i, payload);
    auto text = [&](int at, const std::string& s) {
      sqlite3_bind_text(stmt, at, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    };
    text(1, l.queue);
    sqlite3_bind_blob(stmt, 2, l.data.data(), static_cast<int>(l.data.size()), SQLITE_TRANSIENT);
    text(3, l.reason);
    sqlite3_bind_int64(stmt, 4, absl::ToUnixMicros(l.last_failed_at));
    sqlite3_bind_int(stmt, 5, static_cast<int>(l.kind));
    sqlite3_bind_int(stmt, 6, l.attempts);
    sqlite3_bind_int64(stmt, 7, absl::ToUnixMicros(l.first_failed_at));
    sqlite3_bind_int64(stmt, 8, absl::ToUnixMicros(l.last_failed_at));
    sqlite3_bind_int(stmt, 9, l.replays);
    text(10, l.message_id);
  });
}

absl::Status FillRedisKeys(redis::Client& client, const std::string& key_prefix, uint64_t series,
                           uint64_t from, uint64_t n) {
  const std::string ms = absl::StrCat(kRetentionMs);
  for (uint64_t at = 0; at < n;) {
    std::vector<std::vector<std::string>> commands;
    for (; at < n && commands.size() < 10000; ++at) {
      commands.push_back({"SET", absl::StrCat(key_prefix, "idem:{", KeyOf(series, from + at), "}"),
                          absl::StrCat("done:", OwnerOf(from + at)), "PX", ms});
    }
    absl::StatusOr<std::vector<redis::Reply>> r =
        client.Execute(std::move(commands), absl::Seconds(60));
    if (!r.ok()) return r.status();
    for (const redis::Reply& reply : *r) {
      if (reply.is_error()) return redis::ReplyStatus(reply);
    }
  }
  return absl::OkStatus();
}

absl::Status FillLetters(DeadLetterStore& store, const std::string& queue, uint64_t n, int payload,
                         int threads) {
  std::atomic<uint64_t> next{0};
  std::vector<absl::Status> failed(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (uint64_t i; (i = next.fetch_add(1)) < n;) {
        absl::StatusOr<std::string> id = store.Store(LetterOf(queue, i, payload));
        if (!id.ok()) {
          failed[t] = id.status();
          return;
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (const absl::Status& s : failed) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisInfo(redis::Client& client, const std::string& section) {
  absl::StatusOr<redis::Reply> r = client.Command({"INFO", section}, absl::Seconds(10));
  if (!r.ok()) return r.status();
  if (r->is_error()) return redis::ReplyStatus(*r);
  return r->str;
}

double InfoNumber(const std::string& info, const std::string& field) {
  const size_t dot = field.find('.');
  const std::string line = field.substr(0, dot);
  size_t at = info.find(absl::StrCat(line, ":"));
  if (at == std::string::npos) return 0;
  at += line.size() + 1;
  if (dot != std::string::npos) {
    const std::string sub = absl::StrCat(field.substr(dot + 1), "=");
    const size_t end = info.find('\n', at);
    const size_t s = info.find(sub, at);
    if (s == std::string::npos || s > end) return 0;
    at = s + sub.size();
  }
  const size_t end = info.find_first_of(",\r\n", at);
  double v = 0;
  (void)absl::SimpleAtod(info.substr(at, end - at), &v);
  return v;
}

void RedisProbe::Reset() {
  (void)client_->Command({"CONFIG", "RESETSTAT"}, absl::Seconds(5));
  cpu_ = Cpu();
}

void RedisProbe::Report(const char* side, int64_t items) {
  absl::StatusOr<std::string> stats = RedisInfo(*client_, "commandstats");
  if (!stats.ok()) return;
  std::printf("  server of %s: %.1f us CPU per item; usec per call: set %.2f, evalsha %.2f\n", side,
              (Cpu() - cpu_) * 1e6 / std::max<int64_t>(1, items),
              InfoNumber(*stats, "cmdstat_set.usec_per_call"),
              InfoNumber(*stats, "cmdstat_evalsha.usec_per_call"));
}

std::string RedisProbe::Rehashing() {
  absl::StatusOr<redis::Reply> r = client_->Command({"DEBUG", "HTSTATS", "0"}, absl::Seconds(5));
  if (!r.ok() || r->is_error()) return "unknown";
  const size_t split = r->str.find("[Expires HT]");
  const bool keys = r->str.find("rehashing target") < split;
  const bool expires = r->str.find("rehashing target", split) != std::string::npos;
  return keys ? (expires ? "keys and expires" : "keys") : (expires ? "expires" : "none");
}

absl::Status RedisProbe::Settle(const std::string& key) {
  while (Rehashing() != "none") {
    std::vector<std::vector<std::string>> commands(100000, {"PTTL", key});
    absl::StatusOr<std::vector<redis::Reply>> r =
        client_->Execute(std::move(commands), absl::Seconds(60));
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

double RedisProbe::Memory() {
  absl::StatusOr<std::string> info = RedisInfo(*client_, "memory");
  return info.ok() ? InfoNumber(*info, "used_memory") : 0;
}

double RedisProbe::Cpu() {
  absl::StatusOr<std::string> info = RedisInfo(*client_, "cpu");
  if (!info.ok()) return 0;
  return bench::ParseServerInfo(*info, absl::Now()).cpu_seconds;
}

}  // namespace bus::growth
