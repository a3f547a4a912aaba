#include "common/redis/internal/connection.h"

#include <chrono>
#include <future>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/post.hpp"
#include "common/redis/internal/connection_impl.h"

namespace bus::redis {
namespace {

namespace asio = boost::asio;

// What is left of `deadline` (Eval's, on the steady clock as the connection's own deadlines).
absl::Duration Left(std::chrono::steady_clock::time_point deadline) {
  return absl::FromChrono(deadline - std::chrono::steady_clock::now());
}

}  // namespace

IoThread::IoThread() : guard_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}

IoThread::~IoThread() {
  guard_.reset();
  thread_.join();
}

Connection::Connection(IoThread* io, ConnectionOptions options, std::function<void()> on_reconnect)
    : io_thread_(io),
      impl_(std::make_shared<Impl>(io->io(), std::move(options), std::move(on_reconnect))) {}

std::shared_ptr<Connection> Connection::Create(IoThread* io, ConnectionOptions options,
                                               std::function<void()> on_reconnect) {
  return std::shared_ptr<Connection>(
      new Connection(io, std::move(options), std::move(on_reconnect)));
}

Connection::~Connection() { Shutdown(); }

uint64_t Connection::reconnects() const {
  return impl_->reconnects.load(std::memory_order_relaxed);
}

void Connection::Shutdown() {
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(impl_->io, [impl = impl_, &done] {
    impl->Shutdown();
    done.set_value();
  });
  fut.wait();
}

std::future<absl::StatusOr<std::vector<Reply>>> Connection::ExecuteAsync(
    std::vector<std::vector<std::string>> commands, absl::Duration timeout) {
  auto req = std::make_shared<Impl::Request>();
  auto fut = req->promise.get_future();
  req->expected = commands.size();
  req->timeout = timeout;
  for (const auto& c : commands) {
    absl::StatusOr<std::string> w = Format(c);
    if (!w.ok()) {
      req->promise.set_value(w.status());
      return fut;
    }
    req->wire += *w;
  }
  if (commands.empty()) {
    req->promise.set_value(std::vector<Reply>{});
    return fut;
  }
  asio::post(impl_->io, [impl = impl_, req] { impl->Submit(req); });
  return fut;
}

absl::StatusOr<std::vector<Reply>> Connection::Execute(
    std::vector<std::vector<std::string>> commands, absl::Duration timeout, std::stop_token stop) {
  if (io_thread_->InThisThread()) {
    return absl::FailedPreconditionError("redis Execute called on the connection's IoThread");
  }
  auto req = std::make_shared<Impl::Request>();
  req->expected = commands.size();
  req->timeout = timeout;
  for (const auto& c : commands) {
    absl::StatusOr<std::string> w = Format(c);
    if (!w.ok()) return w.status();
    req->wire += *w;
  }
  if (commands.empty()) return std::vector<Reply>{};
  auto fut = req->promise.get_future();
  std::optional<std::stop_callback<std::function<void()>>> on_stop;
  if (stop.stop_possible()) {
    on_stop.emplace(stop, std::function<void()>([impl = impl_, req] {
                      asio::post(impl->io, [impl, req] { impl->Cancel(req); });
                    }));
  }
  asio::post(impl_->io, [impl = impl_, req] { impl->Submit(req); });
  return fut.get();
}

absl::StatusOr<Reply> Connection::Command(std::vector<std::string> args, absl::Duration timeout,
                                          std::stop_token stop) {
  std::vector<std::vector<std::string>> cmds;
  cmds.push_back(std::move(args));
  absl::StatusOr<std::vector<Reply>> r = Execute(std::move(cmds), timeout, std::move(stop));
  if (!r.ok()) return r.status();
  return std::move((*r)[0]);
}

absl::StatusOr<std::string> Connection::ScriptSha(const Script& script, absl::Duration timeout,
                                                  bool reload) {
  if (!reload) {
    absl::MutexLock lock(&sha_mu_);
    auto it = sha_.find(&script);
    if (it != sha_.end()) return it->second;
  }
  absl::StatusOr<Reply> r = Command({"SCRIPT", "LOAD", script.source}, timeout);
  if (!r.ok()) return r.status();
  if (r->is_error()) return ReplyStatus(*r);
  absl::MutexLock lock(&sha_mu_);
  sha_[&script] = r->str;
  return r->str;
}

absl::StatusOr<std::vector<Reply>> Connection::Eval(const Script& script,
                                                    std::vector<std::vector<std::string>> calls,
                                                    absl::Duration timeout,
                                                    std::vector<std::string> then) {
  const auto deadline = std::chrono::steady_clock::now() + ToChrono(timeout);
  absl::StatusOr<std::string> sha = ScriptSha(script, timeout, false);
  if (!sha.ok()) return sha.status();
  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(calls.size());
  for (auto& c : calls) {
    std::vector<std::string> cmd;
    cmd.reserve(c.size() + 2);
    cmd.push_back("EVALSHA");
    cmd.push_back(*sha);
    for (auto& a : c) cmd.push_back(std::move(a));
    cmds.push_back(std::move(cmd));
  }
  const size_t n = cmds.size();
  if (!then.empty()) cmds.push_back(then);
  absl::StatusOr<std::vector<Reply>> replies = Execute(cmds, Left(deadline));
  if (!replies.ok()) return replies;
  // A server without the script (restarted, failed over, SCRIPT FLUSH) ran none of the calls
  // that got NOSCRIPT: load it again and repeat just those.
  std::vector<size_t> missing;
  for (size_t i = 0; i < n; ++i) {
    if ((*replies)[i].is_error() && absl::StartsWith((*replies)[i].str, "NOSCRIPT")) {
      missing.push_back(i);
    }
  }
  if (missing.empty()) return replies;
  sha = ScriptSha(script, Left(deadline), true);
  if (!sha.ok()) return sha.status();
  std::vector<std::vector<std::string>> again;
  for (size_t i : missing) {
    cmds[i][1] = *sha;
    again.push_back(std::move(cmds[i]));
  }
  if (!then.empty()) again.push_back(std::move(then));
  absl::StatusOr<std::vector<Reply>> second = Execute(std::move(again), Left(deadline));
  if (!second.ok()) return second.status();
  for (size_t k = 0; k < missing.size(); ++k) (*replies)[missing[k]] = std::move((*second)[k]);
  if (second->size() > missing.size()) replies->back() = std::move(second->back());
  return replies;
}

}  // namespace bus::redis
