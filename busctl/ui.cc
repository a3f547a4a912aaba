#include "busctl/ui.h"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "admin/admin_server.h"

namespace busctl {

absl::StatusOr<Listen> ParseListen(absl::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError("--listen must be HOST:PORT, e.g. 127.0.0.1:8080");
  }
  Listen l;
  absl::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  l.address = std::string(host);
  if (!absl::SimpleAtoi(text.substr(colon + 1), &l.port) || l.port < 0 || l.port > 65535) {
    return absl::InvalidArgumentError("--listen: the port must be a number in [0, 65535]");
  }
  return l;
}

absl::Status ServeUi(const Listen& listen, std::shared_ptr<bus::Driver> driver,
                     std::shared_ptr<bus::DeadLetterStore> dead_letters, std::ostream& out,
                     std::stop_token stop) {
  bus::AdminServerOptions o;
  o.address = listen.address;
  o.port = listen.port;
  o.console.enabled = true;
  o.console.driver = std::move(driver);
  o.console.dead_letters = std::move(dead_letters);
  absl::StatusOr<std::unique_ptr<bus::AdminServer>> admin = bus::AdminServer::Start(std::move(o));
  if (!admin.ok()) return admin.status();
  const bool v6 = listen.address.find(':') != std::string::npos;
  out << "console at http://" << (v6 ? "[" : "") << listen.address << (v6 ? "]" : "") << ":"
      << (*admin)->port() << "/ui" << std::endl;
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, stop, [] { return false; });
  (*admin)->Stop();
  return absl::OkStatus();
}

absl::Status UiCommand(absl::string_view listen, std::shared_ptr<bus::Driver> driver,
                       std::shared_ptr<bus::DeadLetterStore> dead_letters) {
  absl::StatusOr<Listen> l = ParseListen(listen);
  if (!l.ok()) return l.status();
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
  absl::Status st =
      ServeUi(*l, std::move(driver), std::move(dead_letters), std::cerr, stop.get_token());
  // ServeUi returns early only on an error: wake the waiter then.
  if (!stop.stop_requested()) pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return st;
}

}  // namespace busctl
