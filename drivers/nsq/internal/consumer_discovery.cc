// ConsumerState, its discovery (consumer.h): polling the nsqlookupds for the nsqd that hold its
// topics, one nsqlookupd per poll in turn, on the schedule of Core::LookupdPollSchedule (a
// bus::Backoff on the core's clock).

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "boost/asio/redirect_error.hpp"
#include "boost/asio/use_awaitable.hpp"
#include "drivers/nsq/internal/consumer.h"
#include "drivers/nsq/internal/lookup.h"

namespace bus::nsq {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;

awaitable<void> ConsumerState::LookupLoop([[maybe_unused]] std::shared_ptr<ConsumerState> self) {
  const NsqOptions& o = core_->options();
  bus::Backoff schedule = core_->LookupdPollSchedule();
  const size_t lookupds = o.lookupd_http_addresses.size();
  size_t next_lookupd = 0;
  while (true) {
    std::vector<std::string> topics;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) co_return;
      for (const Sub& s : subs_) {
        if (!s.removed) topics.push_back(s.topic);
      }
      poll_now_ = false;
    }
    // One nsqlookupd per poll, in turn (as go-nsq does): each answers for the whole cluster,
    // and asking one spares the others. Its answer replaces what the last poll found for the
    // topic, so an nsqd it no longer lists is forgotten: a live connection to it stays until
    // it closes, and then it is not reconnected (EnsureConnections drops the slot).
    const std::string& lookupd = o.lookupd_http_addresses[next_lookupd % lookupds];
    ++next_lookupd;
    std::map<std::string, std::set<std::string>> found;
    for (const std::string& topic : topics) {
      absl::StatusOr<std::vector<std::string>> r = co_await LookupProducers(
          core_->io(), core_->LookupdClient(), lookupd, topic, o.timeouts.connect);
      if (!r.ok()) {
        core_->Log(LogLevel::kWarning, "lookup_failed",
                   absl::StrCat("consumer of ", queue_, ": ", r.status().message()),
                   r.status().message());
        continue;  // what the last poll found for the topic stays
      }
      found[topic].insert(r->begin(), r->end());
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) co_return;
      for (auto& [topic, addrs] : found) {
        std::set<std::string>& known = discovered_[topic];
        for (const std::string& a : addrs) {
          if (!known.contains(a)) {
            core_->Log(LogLevel::kInfo, "nsqd_discovered",
                       absl::StrCat("consumer of ", queue_, ": lookupd lists nsqd ", a,
                                    " for topic ", topic));
          }
        }
        for (const std::string& a : known) {
          if (!addrs.contains(a)) {
            core_->Log(LogLevel::kInfo, "nsqd_unlisted",
                       absl::StrCat("consumer of ", queue_, ": lookupd ", lookupd,
                                    " no longer lists nsqd ", a, " for topic ", topic,
                                    "; not reconnected once its connection closes"));
          }
        }
        known = std::move(addrs);
      }
      EnsureConnections();
    }
    const absl::Duration wait = schedule.Next();
    // The schedule is on the core's clock; the asio timer, armed from Backoff::Next()'s wait,
    // only paces how often it is looked at.
    const absl::Time until = core_->Now() + wait;
    // Sleep in short steps so that a lost connection or a new binding triggers a poll soon.
    while (core_->Now() < until) {
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) co_return;
        if (poll_now_) break;
      }
      poll_timer_.expires_after(absl::ToChronoNanoseconds(
          std::min(until - core_->Now(), std::max(absl::Milliseconds(200), wait / 10))));
      error_code ec;
      co_await poll_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }
}

}  // namespace bus::nsq
