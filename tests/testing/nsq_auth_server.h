// A minimal nsqd auth server (nsqd --auth-http-address): GET /auth?secret=... grants every
// topic and channel to the one secret it was made with, 403 to anything else (and to every
// secret while SetRefusing(true)).
//
//   NsqAuthServer auth("right");
//   auto nsqd = NsqdServer::Start({.auth_http_address = auth.address()});
//
// Thread-safety: requests() may be read from any thread; construct and destroy on one.

#ifndef TESTS_TESTING_NSQ_AUTH_SERVER_H_
#define TESTS_TESTING_NSQ_AUTH_SERVER_H_

#include <atomic>
#include <string>
#include <thread>

#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"

namespace bus::testing {

class NsqAuthServer {
 public:
  explicit NsqAuthServer(std::string secret);
  ~NsqAuthServer();
  NsqAuthServer(const NsqAuthServer&) = delete;
  NsqAuthServer& operator=(const NsqAuthServer&) = delete;

  // "127.0.0.1:<port>".
  std::string address() const;
  // Auth requests answered so far.
  int requests() const { return requests_.load(); }
  // True: refuses every secret from now on (a revoked secret); false: grants the right one again.
  void SetRefusing(bool refusing) { refusing_.store(refusing); }

 private:
  void Run();

  const std::string secret_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::atomic<bool> refusing_{false};
  std::thread thread_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_NSQ_AUTH_SERVER_H_
