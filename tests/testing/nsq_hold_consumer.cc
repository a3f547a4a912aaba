// Test helper process: consumes `count` messages from a queue without settling them, writes
// `marker` once it holds them, then waits to be killed. nsq_driver_test SIGKILLs it to check
// that a dead consumer's in-flight messages are redelivered.
//
// Usage: nsq_hold_consumer <nsqd tcp address> <queue> <count> <lease ms> <marker path>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "drivers/nsq/nsq_driver.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s nsqd queue count lease_ms marker\n", argv[0]);
    return 2;
  }
  bus::NsqOptions options;
  options.nsqd_tcp_addresses = {argv[1]};
  auto driver = bus::NewNsqDriver(options);
  if (!driver.ok()) return 3;
  const int count = std::atoi(argv[3]);
  auto consumer = (*driver)->NewConsumer(
      argv[2], bus::ConsumerOptions{count, absl::Milliseconds(std::atoi(argv[4]))});
  if (!consumer.ok()) return 4;
  std::vector<bus::Delivery> held;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (static_cast<int>(held.size()) < count && absl::Now() < deadline) {
    if (!(*consumer)->Receive(count, absl::Milliseconds(200), {}, &held).ok()) return 5;
  }
  if (static_cast<int>(held.size()) < count) return 6;
  std::ofstream(argv[5]) << held.size() << "\n";
  while (true) pause();  // hold until SIGKILL
}
