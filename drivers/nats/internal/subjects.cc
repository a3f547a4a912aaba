#include "drivers/nats/internal/subjects.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace bus::nats {
namespace {

std::string EncodeName(absl::string_view name) { return absl::StrReplaceAll(name, {{".", "~"}}); }
std::string DecodeName(absl::string_view name) { return absl::StrReplaceAll(name, {{"~", "."}}); }

bool PlainWord(absl::string_view word) {
  if (word.empty()) return false;
  for (char c : word) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string EncodeWord(absl::string_view word) {
  return PlainWord(word) ? std::string(word) : absl::StrCat("~", absl::BytesToHexString(word));
}

std::optional<std::string> DecodeWord(absl::string_view token) {
  if (!absl::ConsumePrefix(&token, "~")) return std::string(token);
  if (token.size() % 2 != 0) return std::nullopt;
  for (char c : token) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return absl::HexStringToBytes(token);
}

// The words of a key; the empty key has none.
std::vector<absl::string_view> Words(absl::string_view key) {
  if (key.empty()) return {};
  return absl::StrSplit(key, '.');
}

}  // namespace

std::string Subjects::All() const { return absl::StrCat(prefix_, ".>"); }

std::string Subjects::Queue(absl::string_view queue) const {
  return absl::StrCat(prefix_, ".q.", EncodeName(queue));
}

std::string Subjects::Delayed(absl::string_view queue, absl::string_view id) const {
  return absl::StrCat(prefix_, ".d.", EncodeName(queue), ".", id);
}

std::string Subjects::DelayedOf(absl::string_view queue) const {
  return absl::StrCat(prefix_, ".d.", EncodeName(queue), ".>");
}

std::string Subjects::AllDelayed() const { return absl::StrCat(prefix_, ".d.>"); }

std::string Subjects::Topic(absl::string_view topic, absl::string_view route_key) const {
  std::string out = absl::StrCat(prefix_, ".t.", EncodeName(topic));
  for (absl::string_view word : Words(route_key)) absl::StrAppend(&out, ".", EncodeWord(word));
  return out;
}

std::vector<std::string> Subjects::TopicWide(absl::string_view topic) const {
  const std::string base = absl::StrCat(prefix_, ".t.", EncodeName(topic));
  return {base, absl::StrCat(base, ".>")};
}

std::optional<std::vector<std::string>> Subjects::BindingFilters(
    absl::string_view topic, absl::string_view binding_key) const {
  if (binding_key.empty()) return TopicWide(topic);
  std::vector<absl::string_view> words = Words(binding_key);
  const bool trailing_hash = words.back() == "#";
  if (trailing_hash) words.pop_back();
  std::string base = absl::StrCat(prefix_, ".t.", EncodeName(topic));
  for (absl::string_view word : words) {
    if (word == "#") return std::nullopt;
    absl::StrAppend(&base, ".", word == "*" ? std::string("*") : EncodeWord(word));
  }
  if (!trailing_hash) return std::vector<std::string>{base};
  return std::vector<std::string>{base, absl::StrCat(base, ".>")};
}

bool Subjects::ParseTopic(absl::string_view subject, std::string* topic,
                          std::string* route_key) const {
  if (!absl::ConsumePrefix(&subject, prefix_) || !absl::ConsumePrefix(&subject, ".t.")) {
    return false;
  }
  std::vector<absl::string_view> tokens = absl::StrSplit(subject, '.');
  *topic = DecodeName(tokens[0]);
  std::vector<std::string> words;
  for (size_t i = 1; i < tokens.size(); ++i) {
    std::optional<std::string> word = DecodeWord(tokens[i]);
    if (!word) return false;
    words.push_back(*std::move(word));
  }
  *route_key = absl::StrJoin(words, ".");
  return true;
}

std::string Subjects::ConsumerName(absl::string_view queue) {
  return absl::StrCat("q-", EncodeName(queue));
}

std::optional<std::string> Subjects::QueueOfConsumer(absl::string_view consumer) {
  if (!absl::ConsumePrefix(&consumer, "q-")) return std::nullopt;
  return DecodeName(consumer);
}

}  // namespace bus::nats
