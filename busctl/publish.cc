// busctl publish QUEUE | --topic T: one message; prints its id.

#include <iostream>
#include <iterator>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bus/publisher.h"
#include "busctl/commands.h"
#include "busctl/output.h"

namespace busctl {

std::optional<UsageError> CheckPublish(const Invocation& in) {
  const bool topic = in.Given("topic");
  if (topic && !in.args.empty())
    return UsageError{"usage: busctl publish --topic T [flags] (no QUEUE)"};
  if (!topic && in.args.size() != 1) return UsageError{"usage: busctl publish QUEUE [flags]"};
  if (in.Given("route_key") && !topic) return UsageError{"--route-key needs --topic"};
  const absl::Duration delay = absl::GetFlag(FLAGS_delay);
  if (delay < absl::ZeroDuration()) {
    return UsageError{absl::StrCat("--delay=", absl::FormatDuration(delay), ": want >= 0")};
  }
  if (topic && delay > absl::ZeroDuration()) return UsageError{"--delay: topics take no delay"};
  for (const std::string& h : absl::GetFlag(FLAGS_header)) {
    const size_t eq = h.find('=');
    if (eq == std::string::npos || eq == 0) {
      return UsageError{absl::StrCat("--header=", h, ": want k=v")};
    }
  }
  if (in.Given("raw") && in.Given("data")) {
    return UsageError{"--raw is about stdin: not with --data"};
  }
  return std::nullopt;
}

absl::Status RunPublish(const Invocation& in) {
  bus::Outgoing out;
  out.biz_uid = absl::GetFlag(FLAGS_biz_uid);
  for (const std::string& h : absl::GetFlag(FLAGS_header)) {
    const size_t eq = h.find('=');
    out.headers.emplace_back(h.substr(0, eq), h.substr(eq + 1));
  }
  if (in.Given("data")) {
    out.payload = absl::GetFlag(FLAGS_data);
  } else {
    out.payload.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    // `echo text | busctl publish q` means "text": the line's end is not part of it.
    if (!absl::GetFlag(FLAGS_raw) && absl::EndsWith(out.payload, "\n")) out.payload.pop_back();
  }
  absl::StatusOr<std::shared_ptr<bus::Driver>> driver = in.Driver();
  if (!driver.ok()) return driver.status();
  absl::StatusOr<bus::Publisher> publisher = bus::Publisher::Create(*driver);
  if (!publisher.ok()) return publisher.status();
  absl::StatusOr<std::string> id =
      in.Given("topic")
          ? publisher->PublishToTopic(absl::GetFlag(FLAGS_topic), absl::GetFlag(FLAGS_route_key),
                                      std::move(out))
          : publisher->SendToQueue(in.args[0], std::move(out), absl::GetFlag(FLAGS_delay));
  if (!id.ok()) return id.status();
  if (JsonOutput()) {
    PrintJson({{"id", *id}});
  } else {
    std::cout << *id << "\n";
  }
  return absl::OkStatus();
}

}  // namespace busctl
