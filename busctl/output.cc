#include "busctl/output.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "busctl/flags.h"

namespace busctl {

bool JsonOutput() { return absl::GetFlag(FLAGS_json); }

std::string Time(absl::Time t) {
  if (t == absl::UnixEpoch()) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t i = 0; i < r.size(); ++i) {
      if (i + 1 == r.size()) {
        absl::StrAppend(&out, r[i]);
      } else {
        absl::StrAppend(&out, r[i], std::string(width[i] - r[i].size() + 2, ' '));
      }
    }
    std::cout << out << "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
}

void PrintJson(const Json& j) { std::cout << j.dump() << "\n"; }

bool Printable(absl::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') return false;
    if (c == 0x7f) return false;
  }
  // Valid UTF-8 is what nlohmann::json accepts; check it so text payloads print as text.
  try {
    (void)Json(std::string(s)).dump();
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

void AddPayload(absl::string_view payload, Json* j) {
  if (Printable(payload)) {
    (*j)["payload_encoding"] = "text";
    (*j)["payload"] = std::string(payload);
  } else {
    (*j)["payload_encoding"] = "hex";
    (*j)["payload"] = absl::BytesToHexString(payload);
  }
}

Json HeadersJson(const bus::Message& msg) {
  Json headers = Json::object();
  for (const auto& [k, v] : msg.headers) {
    headers[Printable(k) ? k : absl::BytesToHexString(k)] =
        Printable(v) ? v : absl::BytesToHexString(v);
  }
  return headers;
}

Progress::Progress(std::string verb) : verb_(std::move(verb)), thread_([this] { Loop(); }) {}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (printed_) std::cerr << "\r" << verb_ << " " << count.load() << "\n";
}

void Progress::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; })) {
    std::cerr << "\r" << verb_ << " " << count.load() << "..." << std::flush;
    printed_ = true;
  }
}

}  // namespace busctl
