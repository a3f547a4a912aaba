// Test servers for the NSQ driver: an nsqd or nsqlookupd started on free loopback ports with a
// private data directory, stopped (SIGKILL) when the object goes away.
//
//   auto lookupd = NsqlookupdServer::Start();
//   auto nsqd = NsqdServer::Start({.lookupd_tcp_address = (*lookupd)->tcp_address()});
//   (*nsqd)->tcp_address();   // "127.0.0.1:<port>"
//   (*nsqd)->Kill(SIGKILL);  (*nsqd)->Restart();   // same ports, same data
//
// Thread-safety: owned by one thread.

#ifndef TESTS_TESTING_NSQ_SERVER_H_
#define TESTS_TESTING_NSQ_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/testing/process.h"

namespace bus::testing {

struct NsqdConfig {
  // nsqlookupd TCP address to register with; empty: none.
  std::string lookupd_tcp_address{};
  // --mem-queue-size; 0 writes every message to disk (survives SIGKILL). -1: nsqd's default.
  int mem_queue_size = -1;
  // --max-req-timeout / --max-msg-size / --msg-timeout when set.
  std::string max_req_timeout{};
  int max_msg_size = 0;
  // --auth-http-address when set.
  std::string auth_http_address{};
  // TLS: --tls-cert and --tls-key when set; --tls-required=<tls_required> ("true", or
  // "tcp-https": TCP needs TLS, plain HTTP stays open) when set; --tls-root-ca-file and
  // --tls-client-auth-policy=require-verify (mutual TLS) when tls_root_ca_file is set.
  std::string tls_cert{};
  std::string tls_key{};
  std::string tls_required{};
  std::string tls_root_ca_file{};
  // --https-address on a free port (needs tls_cert): nsqd's HTTP API over TLS.
  bool https = false;
  std::vector<std::string> extra_args{};
};

class NsqdServer {
 public:
  static absl::StatusOr<std::unique_ptr<NsqdServer>> Start(NsqdConfig config = {});
  ~NsqdServer();

  std::string tcp_address() const;
  std::string http_address() const;
  // With NsqdConfig::https.
  std::string https_address() const;
  int tcp_port() const { return tcp_port_; }

  // Sends `signal` and waits for nsqd to exit.
  void Kill(int signal);
  // Starts nsqd again on the same ports with the same data directory.
  absl::Status Restart();
  // Starts nsqd again on the same ports with a new, empty data directory: a replaced machine
  // that kept its address and lost what the old one had on disk.
  absl::Status RestartEmpty();

 private:
  NsqdServer() = default;
  absl::Status Launch();

  NsqdConfig config_;
  int tcp_port_ = 0;
  int http_port_ = 0;
  int https_port_ = 0;
  std::string data_dir_;
  std::unique_ptr<ChildProcess> child_;
};

class NsqlookupdServer {
 public:
  static absl::StatusOr<std::unique_ptr<NsqlookupdServer>> Start();
  ~NsqlookupdServer();

  std::string tcp_address() const;
  std::string http_address() const;

 private:
  NsqlookupdServer() = default;
  int tcp_port_ = 0;
  int http_port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_NSQ_SERVER_H_
