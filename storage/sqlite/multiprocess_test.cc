// Two processes hammer one database file through both stores at once (acquire, mark done,
// release, store, remove) with several threads each. The end state must be consistent (every
// key handled exactly once, exactly the letters that were kept remain), and no `database is
// locked` error may escape: each child exits 0 only if every call gave an expected result.

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/sqlite/sqlite_database.h"
#include "gtest/gtest.h"
#include "idempotency/sqlite/idempotency_store.h"
#include "storage/sqlite/dead_letter_store.h"
#include "tests/testing/letters.h"
#include "tests/testing/process.h"

namespace bus::testing {
namespace {

constexpr char kChildEnv[] = "BUS_SQLITE_HAMMER_CHILD";
constexpr int kKeys = 2000;
constexpr int kThreadsPerChild = 4;
constexpr char kQueue[] = "shared";

std::string KeyName(int i) { return absl::StrCat("orders.", i); }

// One child: kThreadsPerChild threads walk the key space in their own random orders until a
// full pass finds every key taken. A taken key is released (a simulated failure) one time in
// three, otherwise "handled": its name is recorded as an effect, it is marked done, and a dead
// letter is stored, half of which are removed again. Writes "E <key>" per effect, "L <data>"
// per letter kept and "X <status>" per unexpected result to `out`.
int RunChild(const std::string& path, const std::string& name, const std::string& out_path) {
  SqliteOptions options;
  options.path = path;
  options.busy_timeout = absl::Seconds(60);
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options);
  if (!db.ok()) {
    std::cerr << db.status() << "\n";
    return 2;
  }
  std::shared_ptr<IdempotencyStore> keys = NewSqliteIdempotencyStore(*db);
  std::shared_ptr<DeadLetterStore> letters = NewSqliteDeadLetterStore(*db);

  absl::Mutex mu;
  std::vector<std::string> lines;
  auto record = [&](std::string line) {
    absl::MutexLock lock(&mu);
    lines.push_back(std::move(line));
  };
  auto unexpected = [&](absl::string_view what, const absl::Status& s) {
    record(absl::StrCat("X ", what, ": ", s.ToString()));
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreadsPerChild; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(std::random_device{}());
      std::vector<int> order(kKeys);
      for (int i = 0; i < kKeys; ++i) order[static_cast<size_t>(i)] = i;
      std::vector<std::string> my_letters;
      int attempt = 0;
      while (true) {
        std::shuffle(order.begin(), order.end(), rng);
        bool took_any = false;
        for (int i : order) {
          const std::string key = KeyName(i);
          const std::string owner = absl::StrCat(name, "-", t, "-", attempt++);
          absl::StatusOr<bool> got = keys->Acquire(key, owner, absl::Minutes(5));
          if (!got.ok()) {
            unexpected("Acquire", got.status());
            continue;
          }
          if (!*got) continue;
          took_any = true;
          if (const absl::Status s = keys->Release(key, "intruder");
              !absl::IsFailedPrecondition(s)) {
            unexpected("Release by a non-owner", s);
          }
          if (rng() % 3 == 0) {
            if (absl::Status s = keys->Release(key, owner); !s.ok()) unexpected("Release", s);
            continue;
          }
          record(absl::StrCat("E ", key));
          if (absl::Status s = keys->MarkDone(key, owner, absl::Hours(1)); !s.ok()) {
            unexpected("MarkDone", s);
          }
          const std::string data = absl::StrCat(owner, " handled ", key);
          absl::StatusOr<std::string> id = letters->Store(Letter(kQueue, data, "hammer"));
          if (!id.ok()) {
            unexpected("Store", id.status());
            continue;
          }
          if (rng() % 2 == 0) {
            if (absl::Status s = letters->Remove(kQueue, *id); !s.ok()) unexpected("Remove", s);
          } else {
            record(absl::StrCat("L ", data));
          }
          if (absl::StatusOr<int64_t> n = letters->Count(kQueue); !n.ok()) {
            unexpected("Count", n.status());
          }
        }
        if (!took_any) break;
      }
    });
  }
  for (auto& th : threads) th.join();
  std::ofstream out(out_path);
  bool clean = true;
  for (const std::string& line : lines) {
    out << line << "\n";
    if (absl::StartsWith(line, "X ")) clean = false;
  }
  out.flush();
  return clean ? 0 : 3;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(SqliteMultiProcessTest, TwoProcessesHammeringOneFileEndConsistent) {
  const std::string dir = MakeTempDir("sqlite_hammer_");
  const std::string path = dir + "/bus.db";
  std::vector<std::unique_ptr<ChildProcess>> children;
  setenv(kChildEnv, "1", 1);
  for (const char* name : {"p1", "p2"}) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Start({SelfExecutable(), path, name, absl::StrCat(dir, "/", name, ".out")},
                            absl::StrCat(dir, "/", name, ".log"));
    ASSERT_TRUE(child.ok()) << child.status();
    children.push_back(*std::move(child));
  }
  unsetenv(kChildEnv);
  for (auto& child : children) {
    absl::StatusOr<int> status = child->Wait(absl::Minutes(4));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status)) << "child crashed: " << *status;
    EXPECT_EQ(WEXITSTATUS(*status), 0) << "a child saw an unexpected result; see its .out";
  }

  std::map<std::string, int> effects;
  std::multiset<std::string> kept;
  for (const char* name : {"p1", "p2"}) {
    int handled = 0;
    for (const std::string& line : ReadLines(absl::StrCat(dir, "/", name, ".out"))) {
      if (absl::StartsWith(line, "E ")) {
        ++effects[line.substr(2)];
        ++handled;
      }
      if (absl::StartsWith(line, "L ")) kept.insert(line.substr(2));
      EXPECT_FALSE(absl::StartsWith(line, "X ")) << name << ": " << line;
    }
    std::cout << name << " handled " << handled << " keys\n";
  }
  // Every key was handled, and exactly once across both processes.
  ASSERT_EQ(effects.size(), static_cast<size_t>(kKeys));
  for (const auto& [key, n] : effects) EXPECT_EQ(n, 1) << key;

  SqliteOptions options;
  options.path = path;
  absl::StatusOr<std::shared_ptr<SqliteDatabase>> db = SqliteDatabase::Open(options);
  ASSERT_TRUE(db.ok()) << db.status();
  std::shared_ptr<IdempotencyStore> keys = NewSqliteIdempotencyStore(*db);
  for (int i = 0; i < kKeys; ++i) {
    EXPECT_FALSE(*keys->Acquire(KeyName(i), "late", absl::Minutes(1))) << KeyName(i);
  }
  // Exactly the letters that were kept remain.
  std::shared_ptr<DeadLetterStore> letters = NewSqliteDeadLetterStore(*db);
  std::multiset<std::string> remaining;
  std::string after;
  while (true) {
    absl::StatusOr<std::vector<DeadLetter>> batch = letters->Fetch(kQueue, 50, after);
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (batch->empty()) break;
    for (const DeadLetter& l : *batch) remaining.insert(l.data);
    after = batch->back().id;
  }
  EXPECT_EQ(remaining, kept);
  EXPECT_EQ(*letters->Count(kQueue), static_cast<int64_t>(kept.size()));
  if (!HasFailure()) RemoveTree(dir);
}

}  // namespace
}  // namespace bus::testing

int main(int argc, char** argv) {
  if (std::getenv(bus::testing::kChildEnv) != nullptr && argc == 4) {
    return bus::testing::RunChild(argv[1], argv[2], argv[3]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
