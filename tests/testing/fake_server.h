// FakeServer: a TCP listener on a free loopback port for tests that play a hostile or broken
// server. It accepts one connection at a time and runs `serve(fd, n)` for the n-th (0-based),
// closing the socket when `serve` returns.
//
//   FakeServer fake([](int fd, int) { Send(fd, "$2000000000\r\n"); });
//   options.port = fake.port();
//
// Thread-safety: construct and destroy on one thread; `serve` runs on the server's own thread.

#ifndef TESTS_TESTING_FAKE_SERVER_H_
#define TESTS_TESTING_FAKE_SERVER_H_

#include <atomic>
#include <functional>
#include <thread>

#include "absl/strings/string_view.h"

namespace bus::testing {

class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd, int n)> serve);
  // Stops accepting and joins the server thread (a `serve` that loops must check stopping()).
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  int port() const { return port_; }
  // Set once the destructor runs: a serve function that streams forever checks it.
  bool stopping() const { return stop_.load(); }

 private:
  std::function<void(int, int)> serve_;
  std::atomic<bool> stop_{false};
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// Writes all of `data` to `fd`; false when the peer went away.
bool SendAll(int fd, absl::string_view data);

}  // namespace bus::testing

#endif  // TESTS_TESTING_FAKE_SERVER_H_
