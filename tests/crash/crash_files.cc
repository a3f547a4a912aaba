#include "tests/crash/crash_files.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bus/publisher.h"

namespace bus::testing {

std::string ConsumerBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                      "/tests/crash/crash_consumer");
}

absl::StatusOr<uint32_t> CrashSeed() {
  uint32_t seed = std::random_device{}();
  if (const char* s = std::getenv("BUS_CRASH_SEED"); s != nullptr && !absl::SimpleAtoi(s, &seed)) {
    return absl::InvalidArgumentError(absl::StrCat("BUS_CRASH_SEED is not a number: ", s));
  }
  std::cout << "crash test seed " << seed << " (BUS_CRASH_SEED=" << seed << " replays it)"
            << std::endl;
  return seed;
}

absl::Status PublishNumbered(std::shared_ptr<Driver> driver, const std::string& queue, int n) {
  Publisher publisher = *Publisher::Create(std::move(driver));
  for (int i = 0; i < n; i += 500) {
    std::vector<Outgoing> batch;
    for (int j = i; j < i + 500 && j < n; ++j) {
      batch.push_back(Outgoing{absl::StrCat("m-", j), absl::StrCat(j), {}});
    }
    if (absl::Status st = publisher.SendBatchToQueue(queue, std::move(batch)).status(); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

EffectsReader::EffectsReader(const std::string& path) {
  sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  sqlite3_busy_timeout(db_, 10000);
}

EffectsReader::~EffectsReader() { sqlite3_close(db_); }

bool EffectsReader::Exec(const char* sql) {
  return sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) == SQLITE_OK;
}

bool EffectsReader::CreateTable() {
  return Exec("PRAGMA journal_mode = WAL") &&
         Exec(
             "CREATE TABLE effects (id INTEGER PRIMARY KEY, biz_uid TEXT NOT NULL, "
             "incarnation INTEGER NOT NULL)");
}

int64_t EffectsReader::Count(const std::string& sql) {
  const std::string text = absl::StrReplaceAll(sql, {{"{effects}", "effects"}});
  sqlite3_stmt* stmt = nullptr;
  int64_t n = -1;
  if (sqlite3_prepare_v2(db_, text.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    n = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  return n;
}

std::map<std::string, std::vector<int>> EffectsReader::All() {
  std::map<std::string, std::vector<int>> out;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT biz_uid, incarnation FROM effects ORDER BY id", -1, &stmt,
                         nullptr) == SQLITE_OK) {
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      out[reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0))].push_back(
          sqlite3_column_int(stmt, 1));
    }
  }
  sqlite3_finalize(stmt);
  return out;
}

bool PostgresEffectsReader::CreateTable() {
  return server_
      .Exec(absl::StrCat("CREATE SCHEMA ", schema_, "; CREATE TABLE ", schema_,
                         ".effects (id bigserial PRIMARY KEY, biz_uid text NOT NULL, "
                         "incarnation integer NOT NULL)"))
      .ok();
}

int64_t PostgresEffectsReader::Count(const std::string& sql) {
  absl::StatusOr<std::vector<std::string>> rows =
      server_.Exec(absl::StrReplaceAll(sql, {{"{effects}", absl::StrCat(schema_, ".effects")}}));
  int64_t n = -1;
  if (!rows.ok() || rows->empty() || !absl::SimpleAtoi((*rows)[0], &n)) return -1;
  return n;
}

std::map<std::string, std::vector<int>> PostgresEffectsReader::All() {
  std::map<std::string, std::vector<int>> out;
  absl::StatusOr<std::vector<std::string>> rows = server_.Exec(
      absl::StrCat("SELECT biz_uid || ' ' || incarnation FROM ", schema_, ".effects ORDER BY id"));
  if (!rows.ok()) return out;
  for (const std::string& row : *rows) {
    std::pair<std::string, std::string> parts = absl::StrSplit(row, ' ');
    int incarnation = -1;
    if (absl::SimpleAtoi(parts.second, &incarnation)) out[parts.first].push_back(incarnation);
  }
  return out;
}

}  // namespace bus::testing
