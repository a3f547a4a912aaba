// Prints tests/testdata/envelope_vectors.json: valid envelopes (fields and their exact bytes)
// and invalid ones (bytes and the error they must produce), for implementations in other
// languages to check themselves against. envelope_test.cc checks this build against the file.
//
//   bazel run //tests:envelope_vectors_gen > tests/testdata/envelope_vectors.json

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "bus/envelope.h"
#include "nlohmann/json.hpp"

namespace {

using bus::Message;

nlohmann::ordered_json Fields(const Message& m) {
  nlohmann::ordered_json j;
  j["id"] = m.id;
  j["biz_uid"] = m.biz_uid;
  j["payload_hex"] = absl::BytesToHexString(m.payload);
  nlohmann::ordered_json headers = nlohmann::ordered_json::array();
  for (const auto& [k, v] : m.headers) {
    headers.push_back({absl::BytesToHexString(k), absl::BytesToHexString(v)});
  }
  j["headers_hex"] = headers;
  j["retried"] = m.retried;
  j["created_at_us"] = absl::ToUnixMicros(m.created_at);
  j["last_error"] = m.last_error;
  j["route_key"] = m.route_key;
  return j;
}

}  // namespace

int main() {
  std::vector<std::pair<std::string, Message>> valid;
  valid.push_back({"empty", Message{}});
  {
    Message m;
    m.id = "0123456789abcdef0123456789abcdef";
    m.biz_uid = "order-42";
    m.payload = "{\"sku\":\"A1\",\"qty\":2}";
    m.headers = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                 {"content-type", "application/json"}};
    m.created_at = absl::FromUnixMicros(1735689600123456);
    valid.push_back({"typical", m});
  }
  {
    Message m;
    m.id = "retry";
    m.payload = std::string("\x00\x01\x02\xfe\xff", 5);
    m.retried = 300;  // two-byte varint
    m.last_error = "db down: connection refused";
    m.created_at = absl::FromUnixMicros(-1);  // before the epoch: zigzag
    m.route_key = "order.created.eu";
    m.headers = {{std::string("k\0", 2), std::string("\xff", 1)}};
    valid.push_back({"binary_retried_topic", m});
  }
  {
    Message m;
    m.id = "big";
    m.payload = std::string(200, 'x');  // 200 needs a two-byte length
    valid.push_back({"two_byte_length", m});
  }

  nlohmann::ordered_json out;
  out["format"] = "bus envelope v1 (docs/wire-format.md)";
  nlohmann::ordered_json v = nlohmann::ordered_json::array();
  for (const auto& [name, m] : valid) {
    v.push_back({{"name", name},
                 {"fields", Fields(m)},
                 {"hex", absl::BytesToHexString(bus::EncodeEnvelope(m))}});
  }
  out["valid"] = v;

  const std::string typical = bus::EncodeEnvelope(valid[1].second);
  std::string long_varint = std::string("\xb5M\x01\x00", 4) + std::string(10, '\xff') + "\x01";
  std::vector<std::tuple<std::string, std::string, std::string>> invalid = {
      {"empty_input", "", "bad magic"},
      {"bad_magic", "XX\x01\x00", "bad magic"},
      {"unknown_version", std::string("\xb5M\x02\x00", 4), "unsupported version 2"},
      {"unknown_flags", std::string("\xb5M\x01\x01", 4), "unknown flags"},
      {"truncated_header", std::string("\xb5M\x01", 3), "truncated"},
      {"truncated_payload", typical.substr(0, typical.size() - 1), "claims"},
      {"trailing_bytes", typical + "!", "trailing bytes"},
      {"varint_overflow", long_varint, "varint longer than 64 bits"},
      {"length_past_end", std::string("\xb5M\x01\x00\x00\x00\x7f", 7), "claims 127 bytes"},
      {"impossible_header_count",
       std::string("\xb5M\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\x03", 13), "cannot fit"},
  };
  nlohmann::ordered_json iv = nlohmann::ordered_json::array();
  for (const auto& [name, bytes, error] : invalid) {
    iv.push_back({{"name", name}, {"hex", absl::BytesToHexString(bytes)}, {"error", error}});
  }
  out["invalid"] = iv;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
