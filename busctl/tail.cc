// busctl tail TOPIC: bind a temporary queue to the topic and print what arrives until
// interrupted.

#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <stop_token>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bus/envelope.h"
#include "busctl/commands.h"
#include "busctl/output.h"

namespace busctl {
namespace {

// One line for a message that `tail` received: the decoded envelope (a body that is not one,
// from a foreign producer, is shown as the payload with id "-").
void PrintTailed(absl::string_view data) {
  absl::StatusOr<bus::Message> msg = bus::DecodeEnvelope(data, data.size() + 1);
  Json j = Json::object();
  absl::string_view payload = data;
  if (msg.ok()) {
    j["id"] = msg->id;
    j["biz_uid"] = msg->biz_uid;
    j["created_at"] = Time(msg->created_at);
    j["route_key"] = msg->route_key;
    j["headers"] = HeadersJson(*msg);
    payload = msg->payload;
  } else {
    j["envelope_error"] = std::string(msg.status().message());
  }
  AddPayload(payload, &j);
  if (JsonOutput()) {
    PrintJson(j);
  } else {
    // One line per message: line breaks in a text payload are shown escaped.
    std::string shown = j["payload"].get<std::string>();
    if (j["payload_encoding"] == "hex") {
      shown = "hex:" + shown;
    } else {
      shown = absl::StrReplaceAll(shown, {{"\n", "\\n"}, {"\r", "\\r"}});
    }
    auto field = [&](const char* k) {
      const std::string v = j.contains(k) ? j[k].get<std::string>() : "";
      return v.empty() ? std::string("-") : v;
    };
    std::cout << absl::StrFormat("%-24s  %-32s  %-12s  %s\n", field("created_at"), field("id"),
                                 field("route_key"), shown);
  }
  std::cout << std::flush;
}

}  // namespace

// Binds a temporary queue, prints what arrives until SIGINT or SIGTERM, then removes the
// binding and the queue. The signals are blocked in every thread (the mask is inherited by the
// driver's threads, made after this) and taken by one thread with sigwait, which stops the
// receive; so cleanup runs on the main thread, outside any signal handler.
absl::Status RunTail(const Invocation& in) {
  const std::string& topic = in.args[0];
  const std::string key = absl::GetFlag(FLAGS_route_key);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::stop_source stop;
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    stop.request_stop();
  });
  // Ends the waiter when tail ends for another reason (an error).
  struct Join {
    std::thread& t;
    std::stop_source& stop;
    ~Join() {
      if (!stop.stop_requested()) pthread_kill(t.native_handle(), SIGTERM);
      t.join();
    }
  } join{waiter, stop};

  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = in.Driver();
  if (!driver.ok()) return driver.status();
  absl::BitGen gen;
  const std::string queue =
      absl::StrCat("tail-", absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
  if (absl::Status st = (*driver)->Subscribe(topic, queue, key); !st.ok()) return st;
  absl::Status result;
  {
    absl::StatusOr<std::unique_ptr<bus::Consumer>> consumer =
        (*driver)->NewConsumer(queue, {.max_in_flight = 64, .lease = absl::Seconds(30)});
    if (!consumer.ok()) {
      result = consumer.status();
    } else {
      std::cerr << "tailing topic " << topic << " (binding key \"" << key << "\") through queue "
                << queue << "; Ctrl-C to stop\n";
      if (!JsonOutput()) {
        std::cout << absl::StrFormat("%-24s  %-32s  %-12s  %s\n", "CREATED_AT", "ID", "ROUTE_KEY",
                                     "PAYLOAD")
                  << std::flush;
      }
      std::vector<bus::Delivery> got;
      while (!stop.stop_requested()) {
        got.clear();
        absl::Status st = (*consumer)->Receive(64, absl::Seconds(10), stop.get_token(), &got);
        if (!st.ok()) {
          result = st;
          break;
        }
        for (const bus::Delivery& d : got) {
          PrintTailed(d.data);
          (*consumer)->Ack(d.receipt).IgnoreError();  // an unacked copy goes with the queue
        }
      }
    }
    // The consumer closes here, before its queue goes.
  }
  // Both even when one fails; the first error is the result.
  absl::Status unbound = (*driver)->Unsubscribe(topic, queue, key);
  absl::Status deleted = (*driver)->DeleteQueue(queue);
  for (absl::Status* st : {&unbound, &deleted}) {
    if (result.ok() && !st->ok()) {
      result = absl::Status(st->code(),
                            absl::StrCat("removing temporary queue ", queue, ": ", st->message()));
    }
  }
  return result;
}

}  // namespace busctl
