// Test utilities for suites that run real servers (redis-server, nsqd, nsqlookupd) or crash
// child processes on purpose: start a child, kill it, wait for it, pick a free loopback port,
// wait for a TCP listener, make a private temporary directory.
//
// Thread-safety: a ChildProcess is owned by one thread; the free functions are thread-safe.

#ifndef TESTS_TESTING_PROCESS_H_
#define TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bus::testing {

class ChildProcess {
 public:
  // Starts argv[0] (searched on PATH) with `argv`. Its stdout and stderr go to `log_path`
  // (appended) or, when empty, to /dev/null. Its environment is this process's plus `env`
  // ("NAME=value" entries, replacing variables of the same name): the way to hand a child a
  // secret, which its command line would show to every user (ps). The child is killed if this
  // process dies (PR_SET_PDEATHSIG), so a crashed test leaves no server behind.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(std::vector<std::string> argv,
                                                             std::string log_path = "",
                                                             std::vector<std::string> env = {});

  // SIGKILLs and reaps the child if it is still running.
  ~ChildProcess();

  pid_t pid() const { return pid_; }

  // Sends `signal`; a no-op if the child already exited.
  void Signal(int signal);

  // Sends `signal` and waits for the child to exit; returns its wait status.
  int Kill(int signal = 9);

  // Waits up to `timeout` for the child to exit. Returns the wait status, or DeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  bool Running();

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  bool reaped_ = false;
  int status_ = 0;
};

// A loopback TCP port that was free a moment ago (bound to 127.0.0.1:0 and released).
absl::StatusOr<int> PickFreePort();

// Waits until a TCP connect to 127.0.0.1:`port` succeeds.
absl::Status WaitForPort(int port, absl::Duration timeout);

// A new empty directory under $TEST_TMPDIR (or /tmp), unique to this call.
std::string MakeTempDir(const std::string& prefix);

// Removes a directory tree (best effort).
void RemoveTree(const std::string& path);

// The path of the running test binary (for re-executing it as a child).
std::string SelfExecutable();

// Runs `fn` in a forked child whose root (if it is root) has lost the capabilities that
// override file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER; also for what
// it executes), so that mode bits hold for it as for any user; returns what `fn` returned, or a
// sentence saying why the child could not run it. The test's own process keeps its capabilities.
// `fn` must not use threads the parent started.
std::string RunWithoutFileOverride(const std::function<std::string()>& fn);

}  // namespace bus::testing

#endif  // TESTS_TESTING_PROCESS_H_
