#include "tests/testing/fake_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

namespace bus::testing {

FakeServer::FakeServer(std::function<void(int fd, int n)> serve) : serve_(std::move(serve)) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 16) != 0) {
    return;  // port() stays 0: a connect to it fails, and the test with it
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] {
    for (int n = 0;; ++n) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      serve_(fd, n);
      close(fd);
    }
  });
}

FakeServer::~FakeServer() {
  stop_ = true;
  shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  close(listen_fd_);
  if (thread_.joinable()) thread_.join();
}

bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace bus::testing
