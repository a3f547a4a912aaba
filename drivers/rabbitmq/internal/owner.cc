#include "drivers/rabbitmq/internal/owner.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bus/logger.h"

namespace bus::rabbitmq {
namespace {

// Frames handled per round before queued tasks get their turn again.
constexpr int kFramesPerRound = 512;
// The longest sleep: rabbitmq-c sends and checks heartbeats only while it is called.
constexpr absl::Duration kMaxSleep = absl::Seconds(1);

}  // namespace

Owner::Owner(std::shared_ptr<const RabbitMqOptions> options, std::shared_ptr<LinkCounters> counters,
             Hooks* hooks, bool keep_connected)
    : options_(std::move(options)),
      counters_(std::move(counters)),
      hooks_(hooks),
      keep_connected_(keep_connected),
      wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  thread_ = std::thread([this] { Loop(); });
}

Owner::~Owner() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
  close(wake_fd_);
}

void Owner::Wake() {
  const uint64_t one = 1;
  // An eventfd write fails only when its counter would overflow: the owner is awake anyway.
  const ssize_t written = write(wake_fd_, &one, sizeof one);
  static_cast<void>(written);
}

absl::Status Owner::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

absl::Status Owner::Call(std::function<absl::Status(Link&)> task, absl::Duration timeout) {
  struct Result {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  auto finish = [result](absl::Status st) {
    absl::MutexLock lock(&result->mu);
    result->status = std::move(st);
    result->done = true;
  };
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("RabbitMQ driver: closed");
    tasks_.push_back(
        Task{[task = std::move(task), finish](Link& l) { finish(task(l)); }, std::move(finish)});
  }
  Wake();
  absl::MutexLock lock(&result->mu);
  if (!result->mu.AwaitWithTimeout(absl::Condition(&result->done), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("RabbitMQ: no answer within ", absl::FormatDuration(timeout)));
  }
  return result->status;
}

void Owner::Post(std::function<void(Link&)> task) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(Task{std::move(task), nullptr});
  }
  Wake();
}

void Owner::FailTasks(const absl::Status& why) {
  std::deque<Task> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (Task& t : tasks) {
    if (t.fail) t.fail(why);
  }
}

void Owner::Loop() {
  Backoff backoff(options_->backoff, options_->random);
  for (;;) {
    bool stop = false;
    bool have_tasks = false;
    {
      absl::MutexLock lock(&mu_);
      stop = stopping_;
      have_tasks = !tasks_.empty();
    }
    if (link_ == nullptr) {
      if (stop) break;
      if (keep_connected_ || have_tasks) {
        Connect(backoff);
      } else {
        Sleep(absl::InfiniteDuration());
      }
      continue;
    }
    RunTasks();
    if (!link_->broken()) Pump();
    if (!link_->broken()) Timers();
    if (link_->broken()) {
      Drop(link_->broken_status());
      continue;
    }
    if (stop) break;
    Sleep(kMaxSleep);
  }
  if (link_ != nullptr) {
    link_.reset();
    counters_->connections.fetch_sub(1);
  }
  const absl::Status closed = absl::CancelledError("RabbitMQ: connection closed");
  hooks_->OnLost(closed);
  FailTasks(closed);
}

void Owner::Connect(Backoff& backoff) {
  absl::StatusOr<std::unique_ptr<Link>> link = Link::Open(*options_);
  absl::Status st = link.status();
  if (st.ok()) st = hooks_->OnOpen(**link);
  if (st.ok()) {
    link_ = std::move(*link);
    counters_->connections.fetch_add(1);
    if (ever_connected_) counters_->reconnects.fetch_add(1);
    ever_connected_ = true;
    backoff.Reset();
    absl::MutexLock lock(&mu_);
    last_error_ = absl::OkStatus();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    last_error_ = st;
  }
  hooks_->OnLost(st);
  FailTasks(st);
  const absl::Time until = absl::Now() + backoff.Next();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    Sleep(std::min(left, kMaxSleep));
  }
}

void Owner::Drop(absl::Status why) {
  link_.reset();
  counters_->connections.fetch_sub(1);
  options_->logger->Write(LogRecord{.level = LogLevel::kWarning,
                                    .time = options_->clock->Now(),
                                    .component = "rabbitmq",
                                    .event = "connection_lost",
                                    .error = why.message(),
                                    .text = "RabbitMQ connection lost; reconnecting"});
  hooks_->OnLost(why);
  FailTasks(why);
}

void Owner::RunTasks() {
  std::deque<Task> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (Task& t : tasks) {
    if (link_->broken()) {
      if (t.fail) t.fail(link_->broken_status());
      continue;
    }
    t.run(*link_);
  }
}

void Owner::Pump() {
  amqp_connection_state_t conn = link_->state();
  for (int i = 0; i < kFramesPerRound && !link_->broken(); ++i) {
    amqp_frame_t frame;
    timeval zero{0, 0};
    const int rc = amqp_simple_wait_frame_noblock(conn, &frame, &zero);
    if (rc == AMQP_STATUS_TIMEOUT) break;
    if (rc != AMQP_STATUS_OK) {
      link_->Break(LibraryStatus(rc, "read"));
      break;
    }
    if (frame.frame_type == AMQP_FRAME_METHOD &&
        frame.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD) {
      auto* close = static_cast<amqp_connection_close_t*>(frame.payload.method.decoded);
      absl::Status st =
          BrokerStatus(close->reply_code, String(close->reply_text), "closed the connection");
      amqp_connection_close_ok_t ok{};
      amqp_send_method(conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
      link_->Break(absl::UnavailableError(st.message()));
      break;
    }
    hooks_->OnFrame(*link_, frame);
  }
  if (!link_->broken()) amqp_maybe_release_buffers(conn);
}

void Owner::Timers() {
  if (hooks_->NextTimer() <= options_->clock->Now()) hooks_->OnTimer(*link_);
}

void Owner::Sleep(absl::Duration max) {
  absl::Duration wait = max;
  if (link_ != nullptr) {
    wait = std::min(wait, hooks_->NextTimer() - options_->clock->Now());
    if (options_->amqp.heartbeat > absl::ZeroDuration()) {
      wait = std::min(wait, options_->amqp.heartbeat / 4);
    }
  }
  wait = std::max(wait, absl::ZeroDuration());
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {link_ != nullptr ? link_->fd() : -1, POLLIN, 0}};
  const int ms = wait == absl::InfiniteDuration()
                     ? -1
                     : static_cast<int>(absl::ToInt64Milliseconds(wait + absl::Microseconds(999)));
  if (poll(fds, 2, ms) > 0 && (fds[0].revents & POLLIN) != 0) {
    uint64_t n = 0;
    const ssize_t got = read(wake_fd_, &n, sizeof n);  // resets the counter; nothing to check
    static_cast<void>(got);
  }
}

}  // namespace bus::rabbitmq
