// ReplyScanner: the bounds a Connection enforces on what a Redis server sends, checked on the
// raw bytes before hiredis's redisReader sees them. hiredis 0.14 buffers a bulk string until all
// of it has arrived (a `$2000000000` header makes it wait for, and store, 2 GB), callocs an
// array's element pointers as soon as it reads the `*N` header (17 GB for `*2147483647`), and
// overflows a signed integer on a length or integer line of 20 digits. So the scanner reads the
// RESP type and header lines itself -- only those: it skips bulk contents and simple-string
// lines without looking at them, and builds no reply -- and refuses
//  - a reply whose bytes (headers and contents of the whole top-level reply, nested arrays
//    included) would exceed `max_bytes`, as soon as a length header announces it;
//  - a reply with more than `max_elements` array elements in all, nested arrays included;
//  - a length or integer line that is not a decimal int64 (what hiredis would overflow on), an
//    unknown type byte, or arrays nested deeper than hiredis supports;
//  - any byte of a reply nobody asked for: more replies than Expect() announced.
// After an error the connection must be dropped: the scanner's position is lost.
//
//   ReplyScanner scanner(options.max_reply_bytes, options.max_reply_elements);
//   scanner.Expect(2);                    // two commands written
//   size_t ok_bytes = bytes.size();
//   absl::Status st = scanner.Scan(bytes, &ok_bytes);
//   redisReaderFeed(reader, bytes.data(), ok_bytes);  // then close if !st.ok()
//
// Thread-safety: none; one per connection, used on its I/O thread.

#ifndef COMMON_REDIS_INTERNAL_REPLY_SCANNER_H_
#define COMMON_REDIS_INTERNAL_REPLY_SCANNER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace bus::redis {

class ReplyScanner {
 public:
  // Deepest array nesting accepted (hiredis 0.14 refuses deeper ones itself).
  static constexpr int kMaxDepth = 7;

  ReplyScanner(int64_t max_bytes, int64_t max_elements)
      : max_bytes_(max_bytes), max_elements_(max_elements) {}

  // `replies` more replies were asked for (commands written to the server).
  void Expect(uint64_t replies) { expected_ += replies; }

  // Checks the next bytes received. OK: hand them all to the reader. Unavailable naming the
  // bound (or the protocol fault) otherwise, and later calls keep failing; then `*accepted`
  // (when given) is how many leading bytes end in complete replies: those may still be handed
  // to the reader, so replies that arrived before the fault are not lost.
  absl::Status Scan(absl::string_view data, size_t* accepted = nullptr);

  // OK, or the refusal every later Scan() returns.
  const absl::Status& status() const { return error_; }

  // Top-level replies completely received so far.
  uint64_t replies() const { return completed_; }

 private:
  enum class State {
    kType,        // at the type byte of a reply or element
    kHeaderLine,  // in a `$`, `*` or `:` line (kept in line_ to parse it)
    kSimpleLine,  // in a `+` or `-` line (skipped up to CRLF)
    kBulk,        // in a bulk string's contents and its CRLF
  };

  absl::Status ScanFrom(absl::string_view data, size_t* boundary);
  absl::Status Fail(std::string message);
  absl::Status EndHeaderLine();
  // One step of ScanFrom per state: each consumes from data[*i].
  absl::Status ScanTypeByte(absl::string_view data, size_t* i);
  absl::Status ScanSimpleLine(absl::string_view data, size_t* i);
  absl::Status ScanHeaderByte(absl::string_view data, size_t* i);
  void ScanBulk(absl::string_view data, size_t* i);
  absl::Status AddBytes(int64_t n);
  // One element (or a whole top-level reply) is complete.
  void ElementDone();

  const int64_t max_bytes_;
  const int64_t max_elements_;
  uint64_t expected_ = 0;
  uint64_t completed_ = 0;
  absl::Status error_;

  State state_ = State::kType;
  char type_ = 0;          // of the header line being read
  std::string line_;       // header line so far (at most a few dozen bytes)
  bool saw_cr_ = false;    // the previous byte of a line was '\r'
  int64_t bulk_left_ = 0;  // bytes of the bulk string (and its CRLF) still to skip
  int64_t reply_bytes_ = 0;
  int64_t reply_elements_ = 0;
  int depth_ = 0;
  int64_t left_[kMaxDepth + 1] = {};  // elements still to come at each open array level
};

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_REPLY_SCANNER_H_
