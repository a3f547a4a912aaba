#include "drivers/nsq/internal/compression.h"

#include <zlib.h>

#include <algorithm>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "boost/crc.hpp"
#include "snappy.h"

namespace bus::nsq {
namespace {

// ---- Snappy framing format ----
constexpr unsigned char kChunkCompressed = 0x00;
constexpr unsigned char kChunkUncompressed = 0x01;
constexpr unsigned char kChunkStreamId = 0xff;
constexpr absl::string_view kStreamId("\xff\x06\x00\x00sNaPpY", 10);
constexpr absl::string_view kStreamIdBody = "sNaPpY";
// The largest uncompressed piece a data chunk may carry.
constexpr size_t kMaxChunkData = 65536;
constexpr size_t kCrcBytes = 4;

void AppendChunkHeader(unsigned char type, size_t length, std::string* out) {
  const char h[4] = {static_cast<char>(type), static_cast<char>(length & 0xff),
                     static_cast<char>((length >> 8) & 0xff),
                     static_cast<char>((length >> 16) & 0xff)};
  out->append(h, sizeof(h));
}

void AppendLe32(uint32_t v, std::string* out) {
  char b[4];
  absl::little_endian::Store32(b, v);
  out->append(b, sizeof(b));
}

class SnappyCodec final : public StreamCodec {
 public:
  absl::Status Encode(absl::string_view data, std::string* out) override {
    if (!wrote_stream_id_) {
      out->append(kStreamId.data(), kStreamId.size());
      wrote_stream_id_ = true;
    }
    while (!data.empty()) {
      const absl::string_view piece = data.substr(0, kMaxChunkData);
      data.remove_prefix(piece.size());
      scratch_.resize(snappy::MaxCompressedLength(piece.size()));
      size_t compressed = 0;
      snappy::RawCompress(piece.data(), piece.size(), scratch_.data(), &compressed);
      const uint32_t crc = MaskedCrc32c(piece);
      // As golang/snappy's writer: store the piece when compression saves less than 1/8.
      if (compressed >= piece.size() - piece.size() / 8) {
        AppendChunkHeader(kChunkUncompressed, kCrcBytes + piece.size(), out);
        AppendLe32(crc, out);
        out->append(piece.data(), piece.size());
      } else {
        AppendChunkHeader(kChunkCompressed, kCrcBytes + compressed, out);
        AppendLe32(crc, out);
        out->append(scratch_.data(), compressed);
      }
    }
    return absl::OkStatus();
  }

  void Feed(absl::string_view data) override {
    // Skippable chunks are dropped as they arrive, without buffering them.
    while (skip_ > 0 && !data.empty()) {
      const size_t n = std::min(skip_, data.size());
      skip_ -= n;
      data.remove_prefix(n);
    }
    in_.append(data.data(), data.size());
  }

  absl::StatusOr<size_t> Decode(size_t max_bytes, std::string* out) override {
    size_t produced = 0;
    while (produced < max_bytes) {
      if (skip_ > 0) {
        const size_t n = std::min(skip_, in_.size() - pos_);
        skip_ -= n;
        pos_ += n;
        if (skip_ > 0) break;
      }
      if (in_.size() - pos_ < 4) break;
      const auto* h = reinterpret_cast<const unsigned char*>(in_.data() + pos_);
      const unsigned char type = h[0];
      const size_t length = h[1] | (size_t{h[2]} << 8) | (size_t{h[3]} << 16);
      if (type >= 0x80 && type != kChunkStreamId) {
        // Padding and the reserved skippable chunks: ignored, whatever their length.
        pos_ += 4;
        skip_ = length;
        continue;
      }
      if (type == kChunkStreamId) {
        if (length != kStreamIdBody.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("snappy stream identifier chunk of ", length, " bytes"));
        }
      } else if (type == kChunkCompressed || type == kChunkUncompressed) {
        if (!seen_stream_id_) {
          return absl::InvalidArgumentError("snappy stream does not start with its identifier");
        }
        const size_t max_length =
            kCrcBytes +
            (type == kChunkCompressed ? snappy::MaxCompressedLength(kMaxChunkData) : kMaxChunkData);
        if (length < kCrcBytes || length > max_length) {
          return absl::InvalidArgumentError(
              absl::StrCat("snappy chunk of ", length, " bytes (at most ", max_length, ")"));
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("snappy stream has reserved unskippable chunk type ", int{type}));
      }
      if (in_.size() - pos_ < 4 + length) break;
      const absl::string_view body(in_.data() + pos_ + 4, length);
      pos_ += 4 + length;
      if (type == kChunkStreamId) {
        if (body != kStreamIdBody) {
          return absl::InvalidArgumentError("snappy stream identifier is not sNaPpY");
        }
        seen_stream_id_ = true;
        continue;
      }
      const uint32_t crc = absl::little_endian::Load32(body.data());
      absl::string_view data = body.substr(kCrcBytes);
      const size_t start = out->size();
      if (type == kChunkCompressed) {
        size_t n = 0;
        if (!snappy::GetUncompressedLength(data.data(), data.size(), &n) || n > kMaxChunkData) {
          return absl::InvalidArgumentError("snappy chunk's uncompressed length is corrupt");
        }
        out->resize(start + n);
        if (!snappy::RawUncompress(data.data(), data.size(), out->data() + start)) {
          return absl::InvalidArgumentError("snappy chunk does not decompress");
        }
        data = absl::string_view(out->data() + start, n);
      } else {
        out->append(data.data(), data.size());
        data = absl::string_view(out->data() + start, data.size());
      }
      if (MaskedCrc32c(data) != crc) {
        return absl::InvalidArgumentError("snappy chunk fails its CRC-32C check");
      }
      produced += data.size();
    }
    Compact();
    return produced;
  }

 private:
  void Compact() {
    if (pos_ == in_.size()) {
      in_.clear();
      pos_ = 0;
    } else if (pos_ > 65536 && pos_ * 2 > in_.size()) {
      in_.erase(0, pos_);
      pos_ = 0;
    }
  }

  bool wrote_stream_id_ = false;
  std::string scratch_;
  bool seen_stream_id_ = false;
  std::string in_;
  size_t pos_ = 0;
  size_t skip_ = 0;
};

// ---- Raw DEFLATE ----
class DeflateCodec final : public StreamCodec {
 public:
  DeflateCodec() = default;
  ~DeflateCodec() override {
    if (deflate_ready_) deflateEnd(&deflate_);
    if (inflate_ready_) inflateEnd(&inflate_);
  }
  DeflateCodec(const DeflateCodec&) = delete;
  DeflateCodec& operator=(const DeflateCodec&) = delete;

  absl::Status Init(int level) {
    // Window bits -15: raw DEFLATE with a 32 KiB window, as Go's compress/flate.
    if (deflateInit2(&deflate_, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      return absl::InternalError("zlib deflateInit2 failed");
    }
    deflate_ready_ = true;
    if (inflateInit2(&inflate_, -15) != Z_OK) {
      return absl::InternalError("zlib inflateInit2 failed");
    }
    inflate_ready_ = true;
    return absl::OkStatus();
  }

  absl::Status Encode(absl::string_view data, std::string* out) override {
    if (data.empty()) return absl::OkStatus();
    deflate_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    deflate_.avail_in = static_cast<uInt>(data.size());
    do {
      const size_t start = out->size();
      const size_t room = std::max<size_t>(4096, deflateBound(&deflate_, deflate_.avail_in));
      out->resize(start + room);
      deflate_.next_out = reinterpret_cast<Bytef*>(out->data() + start);
      deflate_.avail_out = static_cast<uInt>(room);
      const int rc = deflate(&deflate_, Z_SYNC_FLUSH);
      out->resize(start + room - deflate_.avail_out);
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return absl::InternalError(absl::StrCat("zlib deflate failed (", rc, ")"));
      }
    } while (deflate_.avail_out == 0 || deflate_.avail_in > 0);
    return absl::OkStatus();
  }

  void Feed(absl::string_view data) override { in_.append(data.data(), data.size()); }

  absl::StatusOr<size_t> Decode(size_t max_bytes, std::string* out) override {
    size_t produced = 0;
    while (produced < max_bytes) {
      if (ended_ && pos_ < in_.size()) {
        return absl::InvalidArgumentError("data after the end of the DEFLATE stream");
      }
      const size_t room = std::min<size_t>(max_bytes - produced, 64 * 1024);
      const size_t start = out->size();
      out->resize(start + room);
      inflate_.next_in = reinterpret_cast<Bytef*>(in_.data() + pos_);
      inflate_.avail_in = static_cast<uInt>(in_.size() - pos_);
      inflate_.next_out = reinterpret_cast<Bytef*>(out->data() + start);
      inflate_.avail_out = static_cast<uInt>(room);
      const int rc = inflate(&inflate_, Z_NO_FLUSH);
      const size_t consumed = (in_.size() - pos_) - inflate_.avail_in;
      const size_t made = room - inflate_.avail_out;
      pos_ += consumed;
      out->resize(start + made);
      produced += made;
      if (rc == Z_STREAM_END) {
        ended_ = true;
        continue;
      }
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return absl::InvalidArgumentError(absl::StrCat("corrupt DEFLATE stream (zlib ", rc,
                                                       inflate_.msg ? ": " : "",
                                                       inflate_.msg ? inflate_.msg : "", ")"));
      }
      if (consumed == 0 && made == 0) break;
    }
    if (pos_ == in_.size()) {
      in_.clear();
      pos_ = 0;
    } else if (pos_ > 65536 && pos_ * 2 > in_.size()) {
      in_.erase(0, pos_);
      pos_ = 0;
    }
    return produced;
  }

 private:
  z_stream deflate_{};
  z_stream inflate_{};
  bool deflate_ready_ = false;
  bool inflate_ready_ = false;
  bool ended_ = false;
  std::string in_;
  size_t pos_ = 0;
};

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t c = Crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8;
}

std::unique_ptr<StreamCodec> NewSnappyCodec() { return std::make_unique<SnappyCodec>(); }

absl::StatusOr<std::unique_ptr<StreamCodec>> NewDeflateCodec(int level) {
  if (level < 1 || level > 9) {
    return absl::InvalidArgumentError(absl::StrCat("deflate level ", level, "; want 1..9"));
  }
  auto codec = std::make_unique<DeflateCodec>();
  if (absl::Status s = codec->Init(level); !s.ok()) return s;
  return std::unique_ptr<StreamCodec>(std::move(codec));
}

}  // namespace bus::nsq
