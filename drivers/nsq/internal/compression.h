// The stream codecs of an NSQ connection after a compression upgrade (IDENTIFY snappy or
// deflate): everything written is encoded, everything read decoded, in both directions.
//
//   std::unique_ptr<StreamCodec> codec = NewSnappyCodec();
//   codec->Encode(commands, &wire);         // flushed: nsqd can decode all of it at once
//   codec->Feed(bytes_read);                // then, until it returns 0:
//   absl::StatusOr<size_t> n = codec->Decode(64 << 10, &plain);
//
// Snappy is the framing format (https://github.com/google/snappy/blob/main/framing_format.txt,
// what nsqd's go-snappystream and go-nsq's golang/snappy streams speak): a stream identifier,
// then chunks of at most 64 KiB of input, each compressed with libsnappy (or stored when that
// does not pay) and checked by a masked CRC-32C of its uncompressed bytes. Deflate is raw
// DEFLATE (RFC 1951, no zlib header) as Go's compress/flate writes it, each Encode ending with
// a sync flush.
//
// Decoding never trusts the peer: a snappy chunk longer than the format allows, a bad
// checksum, an unknown unskippable chunk or corrupt DEFLATE is an InvalidArgument error (the
// caller closes the connection), and Decode produces output in bounded steps, so a small input
// that inflates enormously is handed over piece by piece.
//
// Thread-safety: one thread encodes and one decodes (the halves share no state).

#ifndef DRIVERS_NSQ_INTERNAL_COMPRESSION_H_
#define DRIVERS_NSQ_INTERNAL_COMPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bus::nsq {

class StreamCodec {
 public:
  virtual ~StreamCodec() = default;
  // Appends the encoding of `data` to `*out`, complete: the peer can decode every byte of
  // `data` from what was appended so far.
  virtual absl::Status Encode(absl::string_view data, std::string* out) = 0;
  // Takes bytes read from the peer (kept until Decode consumes them).
  virtual void Feed(absl::string_view data) = 0;
  // Appends decoded bytes to `*out`: about `max_bytes` at most (snappy may exceed it by part
  // of one 64 KiB chunk). 0 when the fed bytes hold nothing more to decode.
  virtual absl::StatusOr<size_t> Decode(size_t max_bytes, std::string* out) = 0;
};

std::unique_ptr<StreamCodec> NewSnappyCodec();
// `level` 1..9.
absl::StatusOr<std::unique_ptr<StreamCodec>> NewDeflateCodec(int level);

// CRC-32C (Castagnoli) of `data`, and the masked form the snappy framing format stores.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskedCrc32c(absl::string_view data);

}  // namespace bus::nsq

#endif  // DRIVERS_NSQ_INTERNAL_COMPRESSION_H_
