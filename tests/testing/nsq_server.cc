#include "tests/testing/nsq_server.h"

#include <csignal>

#include "absl/strings/str_cat.h"

namespace bus::testing {
namespace {

std::string Loopback(int port) { return absl::StrCat("127.0.0.1:", port); }

std::string LogPath(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name, ".log");
}

}  // namespace

absl::StatusOr<std::unique_ptr<NsqdServer>> NsqdServer::Start(NsqdConfig config) {
  std::unique_ptr<NsqdServer> s(new NsqdServer());
  s->config_ = std::move(config);
  absl::StatusOr<int> tcp = PickFreePort();
  if (!tcp.ok()) return tcp.status();
  absl::StatusOr<int> http = PickFreePort();
  if (!http.ok()) return http.status();
  s->tcp_port_ = *tcp;
  s->http_port_ = *http;
  s->data_dir_ = MakeTempDir("nsqd");
  if (s->config_.https) {
    absl::StatusOr<int> https = PickFreePort();
    if (!https.ok()) return https.status();
    s->https_port_ = *https;
  }
  if (absl::Status st = s->Launch(); !st.ok()) return st;
  return s;
}

absl::Status NsqdServer::Launch() {
  std::vector<std::string> argv = {
      "nsqd",
      absl::StrCat("--tcp-address=", Loopback(tcp_port_)),
      absl::StrCat("--http-address=", Loopback(http_port_)),
      absl::StrCat("--https-address=", https_port_ > 0 ? Loopback(https_port_) : ""),
      "--broadcast-address=127.0.0.1",
      absl::StrCat("--data-path=", data_dir_),
      "--log-level=warn",
  };
  if (!config_.lookupd_tcp_address.empty()) {
    argv.push_back(absl::StrCat("--lookupd-tcp-address=", config_.lookupd_tcp_address));
  }
  if (config_.mem_queue_size >= 0) {
    argv.push_back(absl::StrCat("--mem-queue-size=", config_.mem_queue_size));
  }
  if (!config_.max_req_timeout.empty()) {
    argv.push_back(absl::StrCat("--max-req-timeout=", config_.max_req_timeout));
  }
  if (config_.max_msg_size > 0) {
    argv.push_back(absl::StrCat("--max-msg-size=", config_.max_msg_size));
  }
  if (!config_.auth_http_address.empty()) {
    argv.push_back(absl::StrCat("--auth-http-address=", config_.auth_http_address));
  }
  if (!config_.tls_cert.empty()) {
    argv.push_back(absl::StrCat("--tls-cert=", config_.tls_cert));
    argv.push_back(absl::StrCat("--tls-key=", config_.tls_key));
  }
  if (!config_.tls_required.empty()) {
    argv.push_back(absl::StrCat("--tls-required=", config_.tls_required));
  }
  if (!config_.tls_root_ca_file.empty()) {
    argv.push_back(absl::StrCat("--tls-root-ca-file=", config_.tls_root_ca_file));
    argv.push_back("--tls-client-auth-policy=require-verify");
  }
  for (const std::string& a : config_.extra_args) argv.push_back(a);
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(argv, LogPath(data_dir_, "nsqd"));
  if (!child.ok()) return child.status();
  child_ = std::move(*child);
  if (absl::Status st = WaitForPort(tcp_port_, absl::Seconds(20)); !st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("nsqd did not start (is it on PATH?): ", st.message()));
  }
  if (absl::Status st = WaitForPort(http_port_, absl::Seconds(20)); !st.ok()) return st;
  return https_port_ > 0 ? WaitForPort(https_port_, absl::Seconds(20)) : absl::OkStatus();
}

NsqdServer::~NsqdServer() {
  if (child_) child_->Kill(SIGKILL);
  RemoveTree(data_dir_);
}

std::string NsqdServer::tcp_address() const { return Loopback(tcp_port_); }
std::string NsqdServer::http_address() const { return Loopback(http_port_); }

std::string NsqdServer::https_address() const { return Loopback(https_port_); }

void NsqdServer::Kill(int signal) {
  if (child_) child_->Kill(signal);
}

absl::Status NsqdServer::Restart() {
  if (child_) child_->Kill(SIGKILL);
  child_.reset();
  return Launch();
}

absl::Status NsqdServer::RestartEmpty() {
  if (child_) child_->Kill(SIGKILL);
  child_.reset();
  RemoveTree(data_dir_);
  data_dir_ = MakeTempDir("nsqd");
  return Launch();
}

absl::StatusOr<std::unique_ptr<NsqlookupdServer>> NsqlookupdServer::Start() {
  std::unique_ptr<NsqlookupdServer> s(new NsqlookupdServer());
  absl::StatusOr<int> tcp = PickFreePort();
  if (!tcp.ok()) return tcp.status();
  absl::StatusOr<int> http = PickFreePort();
  if (!http.ok()) return http.status();
  s->tcp_port_ = *tcp;
  s->http_port_ = *http;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start({
      "nsqlookupd",
      absl::StrCat("--tcp-address=", Loopback(s->tcp_port_)),
      absl::StrCat("--http-address=", Loopback(s->http_port_)),
      "--broadcast-address=127.0.0.1",
      "--log-level=warn",
  });
  if (!child.ok()) return child.status();
  s->child_ = std::move(*child);
  if (absl::Status st = WaitForPort(s->tcp_port_, absl::Seconds(20)); !st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("nsqlookupd did not start (is it on PATH?): ", st.message()));
  }
  if (absl::Status st = WaitForPort(s->http_port_, absl::Seconds(20)); !st.ok()) return st;
  return s;
}

NsqlookupdServer::~NsqlookupdServer() {
  if (child_) child_->Kill(SIGKILL);
}

std::string NsqlookupdServer::tcp_address() const { return Loopback(tcp_port_); }
std::string NsqlookupdServer::http_address() const { return Loopback(http_port_); }

}  // namespace bus::testing
