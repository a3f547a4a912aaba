#include "common/redis/internal/reply_scanner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace bus::redis {
namespace {

// '-', 19 digits and the '\r' of a header line; anything longer is no int64.
constexpr size_t kMaxHeaderLine = 21;

}  // namespace

absl::Status ReplyScanner::Fail(std::string message) {
  error_ = absl::UnavailableError(std::move(message));
  return error_;
}

absl::Status ReplyScanner::AddBytes(int64_t n) {
  reply_bytes_ += n;
  if (reply_bytes_ > max_bytes_) {
    return Fail(absl::StrCat("redis reply larger than max_reply_bytes (", max_bytes_, " bytes)"));
  }
  return absl::OkStatus();
}

void ReplyScanner::ElementDone() {
  while (depth_ > 0) {
    if (--left_[depth_ - 1] > 0) return;
    --depth_;  // that array is complete: one element of its parent
  }
  ++completed_;
}

absl::Status ReplyScanner::EndHeaderLine() {
  // What hiredis's string2ll accepts: "0", or an optional '-' and 1 to 19 digits without a
  // leading zero ("-0", "01" and "+1" are refused), within -(2^63 - 1) to 2^63 - 1 (hiredis
  // also takes -2^63, refused here as no reply needs it). A line this scanner accepted and
  // hiredis refused would surface as hiredis's error instead of the scanner's.
  absl::string_view digits = line_;
  const bool negative = absl::ConsumePrefix(&digits, "-");
  uint64_t magnitude = 0;
  if (digits.empty() || digits.size() > 19 || (digits[0] == '0' && line_ != "0") ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &magnitude) ||
      magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Fail(absl::StrCat("redis protocol error: bad '", std::string(1, type_), "' line \"",
                             absl::CHexEscape(line_), "\""));
  }
  const int64_t value =
      negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  state_ = State::kType;
  switch (type_) {
    case ':':
      ElementDone();
      return absl::OkStatus();
    case '$':
      if (value == -1) {
        ElementDone();
        return absl::OkStatus();
      }
      if (value < 0) break;
      // The announced contents and their CRLF must fit in what is left of the bound.
      if (value > max_bytes_ - reply_bytes_ - 2) {
        return Fail(absl::StrCat("redis reply larger than max_reply_bytes (", max_bytes_,
                                 " bytes): a bulk string of ", value, " bytes announced"));
      }
      bulk_left_ = value + 2;
      state_ = State::kBulk;
      return absl::OkStatus();
    case '*':
      if (value == -1 || value == 0) {
        ElementDone();
        return absl::OkStatus();
      }
      if (value < 0) break;
      if (value > max_elements_ - reply_elements_) {
        return Fail(absl::StrCat("redis reply with more than max_reply_elements (", max_elements_,
                                 ") array elements: an array of ", value, " announced"));
      }
      if (depth_ == kMaxDepth) {
        return Fail(absl::StrCat("redis protocol error: arrays nested deeper than ", kMaxDepth));
      }
      reply_elements_ += value;
      left_[depth_++] = value;
      return absl::OkStatus();
  }
  return Fail(absl::StrCat("redis protocol error: bad length ", value));
}

absl::Status ReplyScanner::Scan(absl::string_view data, size_t* accepted) {
  size_t boundary = 0;  // the end of the last complete reply in `data`
  if (accepted != nullptr) *accepted = 0;
  if (!error_.ok()) return error_;
  const absl::Status st = ScanFrom(data, &boundary);
  if (accepted != nullptr) *accepted = st.ok() ? data.size() : boundary;
  return st;
}

absl::Status ReplyScanner::ScanTypeByte(absl::string_view data, size_t* i) {
  if (depth_ == 0) {
    if (completed_ >= expected_) {
      return Fail(
          "redis server sent bytes nobody asked for (no request pending); the connection was "
          "dropped");
    }
    reply_bytes_ = 0;
    reply_elements_ = 0;
  }
  const char c = data[(*i)++];
  if (absl::Status st = AddBytes(1); !st.ok()) return st;
  saw_cr_ = false;
  if (c == '+' || c == '-') {
    state_ = State::kSimpleLine;
  } else if (c == ':' || c == '$' || c == '*') {
    state_ = State::kHeaderLine;
    type_ = c;
    line_.clear();
  } else {
    return Fail(absl::StrCat("redis protocol error: invalid reply type byte 0x",
                             absl::Hex(static_cast<unsigned char>(c))));
  }
  return absl::OkStatus();
}

absl::Status ReplyScanner::ScanSimpleLine(absl::string_view data, size_t* i) {
  // The line ends at the first CRLF, as hiredis reads it.
  const size_t start = *i;
  bool end = false;
  while (*i < data.size() && !end) {
    const char c = data[(*i)++];
    end = c == '\n' && saw_cr_;
    saw_cr_ = c == '\r';
  }
  if (absl::Status st = AddBytes(static_cast<int64_t>(*i - start)); !st.ok()) return st;
  if (end) {
    state_ = State::kType;
    ElementDone();
  }
  return absl::OkStatus();
}

absl::Status ReplyScanner::ScanHeaderByte(absl::string_view data, size_t* i) {
  const char c = data[(*i)++];
  if (absl::Status st = AddBytes(1); !st.ok()) return st;
  if (c == '\n' && saw_cr_) {
    line_.pop_back();  // the '\r'
    return EndHeaderLine();
  }
  saw_cr_ = c == '\r';
  line_.push_back(c);
  if (line_.size() > kMaxHeaderLine) {
    return Fail(absl::StrCat("redis protocol error: '", std::string(1, type_),
                             "' line longer than ", kMaxHeaderLine, " bytes"));
  }
  return absl::OkStatus();
}

void ReplyScanner::ScanBulk(absl::string_view data, size_t* i) {
  const int64_t n = std::min<int64_t>(bulk_left_, static_cast<int64_t>(data.size() - *i));
  *i += static_cast<size_t>(n);
  bulk_left_ -= n;
  reply_bytes_ += n;  // within the bound: checked when the header announced it
  if (bulk_left_ == 0) {
    state_ = State::kType;
    ElementDone();
  }
}

absl::Status ReplyScanner::ScanFrom(absl::string_view data, size_t* boundary) {
  size_t i = 0;
  uint64_t completed = completed_;
  while (i < data.size()) {
    if (completed_ != completed) {
      completed = completed_;
      *boundary = i;
    }
    absl::Status st;
    switch (state_) {
      case State::kType:
        st = ScanTypeByte(data, &i);
        break;
      case State::kSimpleLine:
        st = ScanSimpleLine(data, &i);
        break;
      case State::kHeaderLine:
        st = ScanHeaderByte(data, &i);
        break;
      case State::kBulk:
        ScanBulk(data, &i);
        break;
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace bus::redis
