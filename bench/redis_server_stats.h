// What a phase of a benchmark cost redis-server: `INFO cpu` and `INFO commandstats` read (with
// redis-cli) before and after the phase, printed as one line that bench/peers/run.sh reads, the
// same line the peers print (bench/peers/serverstats):
//
//   server phase=P msgs=N secs=S cpu_s=C cpu_us_per_msg=U busy=B cmds_per_msg=K
//          scripts_per_msg=E top=CMD:PER_MSG,...
//
// cpu is used_cpu_user + used_cpu_sys; busy = cpu / wall time of the phase; cmds counts every
// command the server ran (those run inside scripts included) except EVAL/EVALSHA/FCALL (counted
// as scripts) and INFO itself.
//
//   bench::ServerSnapshot before = bench::TakeServerSnapshot(port);
//   ...  // the phase, in which n messages settle
//   bench::PrintServerPhase("consume", n, before, bench::TakeServerSnapshot(port));

#ifndef BENCH_REDIS_SERVER_STATS_H_
#define BENCH_REDIS_SERVER_STATS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"

namespace bench {

struct ServerSnapshot {
  bool ok = false;  // false when redis-cli failed (PrintServerPhase then prints nothing)
  absl::Time at;
  double cpu_seconds = 0;  // used_cpu_user + used_cpu_sys
  // total_reads_processed, total_writes_processed: one per socket read or write (pipelined
  // requests share one).
  int64_t reads = 0;
  int64_t writes = 0;
  std::map<std::string, int64_t> calls;  // commandstats name -> calls
  std::map<std::string, int64_t> usec;   // commandstats name -> microseconds in it
};

// Runs `redis-cli -h 127.0.0.1 -p port INFO cpu stats commandstats`.
ServerSnapshot TakeServerSnapshot(int port);

// Parses the text of INFO (the cpu, stats and commandstats sections).
ServerSnapshot ParseServerInfo(const std::string& info, absl::Time at);

// Prints the `server phase=...` line for a phase from `before` to `after` in which `messages`
// messages settled.
void PrintServerPhase(const char* phase, int messages, const ServerSnapshot& before,
                      const ServerSnapshot& after);

// Prints the detail of the same phase per message (docs/benchmarks/redis.md, "Server work per
// message"): CPU us, socket reads and writes, and per command calls and us (a script's us
// include the commands it calls, which are counted as commands too).
void PrintServerWork(const ServerSnapshot& before, const ServerSnapshot& after, int messages);

}  // namespace bench

#endif  // BENCH_REDIS_SERVER_STATS_H_
