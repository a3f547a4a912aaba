#include "bench/growth_compare.h"

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"

ABSL_FLAG(bool, per_round, false, "also print each round's rates");

namespace bus::growth {
namespace {

struct Side {
  std::vector<double> us;  // per operation
  double secs = 0;         // the blocks' wall time
  int64_t items = 0;
  double Rate() const { return secs > 0 ? items / secs : 0; }
  double P99() {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, us.size() * 99 / 100)];
  }
};

bool Block(const Subject& s, int threads, Side* side) {
  if (absl::Status st = s.prepare(); !st.ok()) {
    std::fprintf(stderr, "prepare: %s\n", st.ToString().c_str());
    return false;
  }
  const int ops = s.ops > 0 ? s.ops : absl::GetFlag(FLAGS_ops);
  std::vector<std::vector<double>> us(threads);
  std::vector<int64_t> items(threads, 0);
  std::vector<absl::Status> failed(threads);
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < ops && failed[t].ok(); ++i) {
        const absl::Time t0 = absl::Now();
        absl::StatusOr<int> n = s.op(t);
        us[t].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
        if (n.ok()) items[t] += *n;
        failed[t] = n.status();
      }
    });
  }
  for (std::thread& w : workers) w.join();
  side->secs += absl::ToDoubleSeconds(absl::Now() - start);
  for (int t = 0; t < threads; ++t) {
    if (!failed[t].ok()) {
      std::fprintf(stderr, "operation: %s\n", failed[t].ToString().c_str());
      return false;
    }
    side->us.insert(side->us.end(), us[t].begin(), us[t].end());
    side->items += items[t];
  }
  return true;
}

}  // namespace

bool Compare(const std::string& what, const std::string& size, const Subject& a, const Subject& b,
             int threads, int64_t* items, const std::function<std::string()>& note) {
  Side sa, sb, warm;  // one untimed block of each first (connections, scripts, caches)
  if (!Block(a, threads, &warm) || !Block(b, threads, &warm)) return false;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    const Side a0 = sa, b0 = sb;
    if (!Block(a, threads, &sa) || !Block(b, threads, &sb) || !Block(b, threads, &sb) ||
        !Block(a, threads, &sa)) {
      return false;
    }
    if (absl::GetFlag(FLAGS_per_round)) {
      std::printf("  round %d: empty %.0f/s, grown %.0f/s%s\n", r + 1,
                  (sa.items - a0.items) / (sa.secs - a0.secs),
                  (sb.items - b0.items) / (sb.secs - b0.secs), note ? note().c_str() : "");
    }
  }
  std::printf("%-36s %9s  empty %9.0f/s p99 %8.0f us | grown %9.0f/s p99 %8.0f us | %.2fx\n",
              what.c_str(), size.c_str(), sa.Rate(), sa.P99(), sb.Rate(), sb.P99(),
              sa.Rate() > 0 ? sb.Rate() / sa.Rate() : 0);
  std::fflush(stdout);
  if (items != nullptr) {
    items[0] = sa.items;
    items[1] = sb.items;
  }
  return true;
}

}  // namespace bus::growth
