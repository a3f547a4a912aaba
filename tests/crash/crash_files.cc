#include "tests/crash/crash_files.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace bus::testing {

std::string ConsumerBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                      "/tests/crash/crash_consumer");
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

int64_t EffectsReader::Count(const char* sql) {
  sqlite3_stmt* stmt = nullptr;
  int64_t n = -1;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) == SQLITE_OK &&
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

}  // namespace bus::testing
