#include "bench/redis_server_stats.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace bench {

ServerSnapshot ParseServerInfo(const std::string& info, absl::Time at) {
  ServerSnapshot s;
  s.at = at;
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    line = absl::StripTrailingAsciiWhitespace(line);
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    double cpu = 0;
    if ((kv.first == "used_cpu_user" || kv.first == "used_cpu_sys") &&
        absl::SimpleAtod(kv.second, &cpu)) {
      s.cpu_seconds += cpu;
      s.ok = true;
    } else if (kv.first == "total_reads_processed") {
      (void)absl::SimpleAtoi(kv.second, &s.reads);
    } else if (kv.first == "total_writes_processed") {
      (void)absl::SimpleAtoi(kv.second, &s.writes);
    } else if (absl::ConsumePrefix(&line, "cmdstat_")) {
      // cmdstat_set:calls=1,usec=2,usec_per_call=2.00,rejected_calls=0,failed_calls=0
      const std::pair<absl::string_view, absl::string_view> name_rest =
          absl::StrSplit(line, absl::MaxSplits(':', 1));
      const std::string name(name_rest.first);
      for (absl::string_view field : absl::StrSplit(name_rest.second, ',')) {
        int64_t v = 0;
        if (absl::ConsumePrefix(&field, "calls=") && absl::SimpleAtoi(field, &v)) {
          s.calls[name] = v;
        } else if (absl::ConsumePrefix(&field, "usec=") && absl::SimpleAtoi(field, &v)) {
          s.usec[name] = v;
        }
      }
    }
  }
  return s;
}

ServerSnapshot TakeServerSnapshot(int port) {
  const std::string cmd =
      absl::StrCat("redis-cli -h 127.0.0.1 -p ", port, " INFO cpu stats commandstats 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const absl::Time at = absl::Now();
  if (pclose(pipe) != 0) return {};
  return ParseServerInfo(out, at);
}

void PrintServerPhase(const char* phase, int messages, const ServerSnapshot& before,
                      const ServerSnapshot& after) {
  if (!before.ok || !after.ok || messages <= 0) return;
  const double secs = absl::ToDoubleSeconds(after.at - before.at);
  const double cpu = after.cpu_seconds - before.cpu_seconds;
  int64_t cmds = 0;
  int64_t scripts = 0;
  std::vector<std::pair<int64_t, std::string>> all;
  for (const auto& [name, calls] : after.calls) {
    const auto it = before.calls.find(name);
    const int64_t d = calls - (it == before.calls.end() ? 0 : it->second);
    if (d <= 0 || name == "info") continue;
    if (name == "eval" || name == "evalsha" || name == "eval_ro" || name == "evalsha_ro" ||
        name == "fcall" || name == "fcall_ro") {
      scripts += d;
    } else {
      cmds += d;
    }
    all.emplace_back(d, name);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (all.size() > 10) all.resize(10);
  std::vector<std::string> top;
  for (const auto& [d, name] : all) {
    top.push_back(absl::StrFormat("%s:%.2f", name, static_cast<double>(d) / messages));
  }
  std::printf(
      "server phase=%s msgs=%d secs=%.3f cpu_s=%.3f cpu_us_per_msg=%.1f busy=%.2f "
      "cmds_per_msg=%.2f scripts_per_msg=%.3f top=%s\n",
      phase, messages, secs, cpu, cpu * 1e6 / messages, secs > 0 ? cpu / secs : 0,
      static_cast<double>(cmds) / messages, static_cast<double>(scripts) / messages,
      absl::StrJoin(top, ",").c_str());
}

void PrintServerWork(const ServerSnapshot& before, const ServerSnapshot& after, int messages) {
  if (!before.ok || !after.ok || messages <= 0) return;
  const double n = messages;
  std::printf(
      "server work per message (consume phase): cpu_us=%.1f reads=%.3f writes=%.3f "
      "(%d messages)\n",
      (after.cpu_seconds - before.cpu_seconds) * 1e6 / n,
      static_cast<double>(after.reads - before.reads) / n,
      static_cast<double>(after.writes - before.writes) / n, messages);
  auto delta = [](const std::map<std::string, int64_t>& a, const std::map<std::string, int64_t>& b,
                  const std::string& name) {
    const auto in_a = a.find(name);
    const auto in_b = b.find(name);
    return (in_a == a.end() ? 0 : in_a->second) - (in_b == b.end() ? 0 : in_b->second);
  };
  double commands = 0;
  for (const auto& [name, calls] : after.calls) {
    const int64_t d = delta(after.calls, before.calls, name);
    if (d <= 0 || name == "info") continue;
    const bool script = name == "evalsha" || name == "eval" || name == "evalsha_ro";
    if (!script) commands += static_cast<double>(d);
    std::printf("  %-12s calls/msg=%.3f  usec/msg=%.2f%s\n", name.c_str(), d / n,
                static_cast<double>(delta(after.usec, before.usec, name)) / n,
                script ? "  (includes the commands it calls)" : "");
  }
  std::printf("  commands/msg (not counting script calls)=%.2f\n", commands / n);
}

}  // namespace bench
