// Throughput of the NSQ driver, shaped like nsq's bench_writer / bench_reader so the two can
// be compared on one nsqd: `write` publishes batches (SendBatchToQueue = MPUB) from --threads
// threads for --runfor (or until --count messages); `read` consumes with --threads consumers
// (max in flight --rdy each), acking every message with its own Ack, for --runfor. Prints
// "ops/s: N".
//
//   nsq_bench --mode=write --nsqd=127.0.0.1:4150 --topic=ours --size=200 --batch_size=200
//   nsq_bench --mode=read  --nsqd=127.0.0.1:4150 --topic=ours
//   nsq_bench --mode=write --nsqd=127.0.0.1:4150,127.0.0.1:4250 --publish_policy=spread
//   nsq_bench --mode=read  --nsqd=127.0.0.1:4150 --topic=t --tls_ca_file=ca.pem
//   --compression=snappy
// (the last: over TLS with snappy; transports.sh compares the transports).

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "drivers/nsq/nsq_driver.h"

ABSL_FLAG(std::string, mode, "write", "write or read");
ABSL_FLAG(std::string, nsqd, "127.0.0.1:4150", "nsqd TCP addresses, comma-separated");
ABSL_FLAG(std::string, publish_policy, "prefer", "NsqOptions.publishing.policy: prefer or spread");
ABSL_FLAG(std::string, topic, "ours", "queue (NSQ topic) to use");
ABSL_FLAG(std::string, channel, bus::NsqOptions().queue_channel,
          "read: the channel (NsqOptions.queue_channel)");
ABSL_FLAG(std::string, tls_ca_file, "", "TLS to nsqd, trusting this CA (empty: plaintext)");
ABSL_FLAG(std::string, compression, "none", "NsqOptions.compression.codec: none, snappy, deflate");
ABSL_FLAG(int, deflate_level, bus::NsqOptions().compression.deflate_level,
          "NsqOptions.compression.deflate_level");
ABSL_FLAG(int, size, 200, "message size in bytes");
ABSL_FLAG(int, batch_size, 200, "messages per SendBatchToQueue");
ABSL_FLAG(int, threads, 2, "publishing threads / consumers (bench_* use GOMAXPROCS)");
ABSL_FLAG(int, rdy, 2500, "max in flight per consumer");
ABSL_FLAG(bool, driver_per_consumer, false, "read: one driver (own I/O threads) per consumer");
ABSL_FLAG(int, io_threads, 2, "NsqOptions.io_threads");
ABSL_FLAG(int64_t, output_buffer_size, bus::NsqOptions().consuming.output_buffer_size,
          "NsqOptions.consuming.output_buffer_size");
ABSL_FLAG(absl::Duration, output_buffer_timeout, bus::NsqOptions().consuming.output_buffer_timeout,
          "NsqOptions.consuming.output_buffer_timeout");
ABSL_FLAG(absl::Duration, runfor, absl::Seconds(10), "how long to run");
ABSL_FLAG(int64_t, count, 0, "write: stop after this many messages (0: run for --runfor only)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  bus::NsqOptions options;
  options.nsqd_tcp_addresses = absl::StrSplit(absl::GetFlag(FLAGS_nsqd), ',');
  absl::StatusOr<bus::NsqPublishPolicy> policy =
      bus::ParseNsqPublishPolicy(absl::GetFlag(FLAGS_publish_policy));
  if (!policy.ok()) {
    std::fprintf(stderr, "%s\n", policy.status().ToString().c_str());
    return 1;
  }
  options.publishing.policy = *policy;
  options.queue_channel = absl::GetFlag(FLAGS_channel);
  if (!absl::GetFlag(FLAGS_tls_ca_file).empty()) {
    options.tls = {.enabled = true, .ca_file = absl::GetFlag(FLAGS_tls_ca_file)};
  }
  absl::StatusOr<bus::NsqCompression> codec =
      bus::ParseNsqCompression(absl::GetFlag(FLAGS_compression));
  if (!codec.ok()) {
    std::fprintf(stderr, "%s\n", codec.status().ToString().c_str());
    return 1;
  }
  options.compression = {.codec = *codec, .deflate_level = absl::GetFlag(FLAGS_deflate_level)};
  options.logger = bus::StderrLogger(bus::LogLevel::kWarning);
  options.io_threads = absl::GetFlag(FLAGS_io_threads);
  options.consuming.output_buffer_size = absl::GetFlag(FLAGS_output_buffer_size);
  options.consuming.output_buffer_timeout = absl::GetFlag(FLAGS_output_buffer_timeout);
  auto driver_or = bus::NewNsqDriver(options);
  if (!driver_or.ok()) {
    std::fprintf(stderr, "%s\n", driver_or.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<bus::Driver> driver = *driver_or;
  const std::string topic = absl::GetFlag(FLAGS_topic);
  const absl::Duration runfor = absl::GetFlag(FLAGS_runfor);
  const int threads = absl::GetFlag(FLAGS_threads);
  std::atomic<int64_t> total{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> workers;
  absl::Time start;

  const std::vector<std::string> batch(absl::GetFlag(FLAGS_batch_size),
                                       std::string(absl::GetFlag(FLAGS_size), 'x'));
  if (absl::GetFlag(FLAGS_mode) == "write") {
    start = absl::Now();
    const absl::Time end = start + runfor;
    const int64_t count = absl::GetFlag(FLAGS_count);
    std::atomic<int64_t> claimed{0};
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        int64_t n = 0;
        while (absl::Now() < end) {
          if (count > 0 && claimed.fetch_add(static_cast<int64_t>(batch.size())) >= count) break;
          absl::Status st = driver->SendBatchToQueue(topic, batch, absl::ZeroDuration());
          if (!st.ok()) {
            std::fprintf(stderr, "publish: %s\n", st.ToString().c_str());
            failed = true;
            break;
          }
          n += static_cast<int64_t>(batch.size());
        }
        total += n;
      });
    }
  } else {
    std::vector<std::unique_ptr<bus::Consumer>> consumers;
    std::vector<std::shared_ptr<bus::Driver>> drivers;
    for (int t = 0; t < threads; ++t) {
      std::shared_ptr<bus::Driver> d = driver;
      if (absl::GetFlag(FLAGS_driver_per_consumer)) {
        d = *bus::NewNsqDriver(options);
        drivers.push_back(d);
      }
      auto c =
          d->NewConsumer(topic, bus::ConsumerOptions{absl::GetFlag(FLAGS_rdy), absl::Seconds(60)});
      if (!c.ok()) {
        std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
        return 1;
      }
      consumers.push_back(std::move(*c));
    }
    start = absl::Now();
    const absl::Time end = start + runfor;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, c = consumers[t].get()] {
        int64_t n = 0;
        std::vector<bus::Delivery> got;
        while (absl::Now() < end) {
          got.clear();
          absl::Status st = c->Receive(absl::GetFlag(FLAGS_rdy), absl::Milliseconds(100), {}, &got);
          if (!st.ok()) {
            std::fprintf(stderr, "receive: %s\n", st.ToString().c_str());
            failed = true;
            break;
          }
          for (const bus::Delivery& d : got) {
            if (!c->Ack(d.receipt).ok()) failed = true;
          }
          n += static_cast<int64_t>(got.size());
        }
        total += n;
      });
    }
    for (auto& w : workers) w.join();
    workers.clear();
    const absl::Duration took = absl::Now() - start;
    std::printf("duration: %s - ops/s: %.0f - messages: %lld\n", absl::FormatDuration(took).c_str(),
                static_cast<double>(total.load()) / absl::ToDoubleSeconds(took),
                static_cast<long long>(total.load()));
    return failed ? 1 : 0;
  }
  for (auto& w : workers) w.join();
  const absl::Duration took = absl::Now() - start;
  std::printf("duration: %s - ops/s: %.0f\n", absl::FormatDuration(took).c_str(),
              static_cast<double>(total.load()) / absl::ToDoubleSeconds(took));
  return failed ? 1 : 0;
}
