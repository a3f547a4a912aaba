#include "drivers/nsq/internal/compression.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace bus::nsq {
namespace {

std::string Sample(size_t bytes) {
  std::string s;
  for (int i = 0; s.size() < bytes; ++i) absl::StrAppend(&s, "frame ", i, " payload; ");
  s.resize(bytes);
  return s;
}

// Decodes everything fed so far, in steps of `step`.
std::string DecodeAll(StreamCodec& codec, size_t step) {
  std::string out;
  while (true) {
    absl::StatusOr<size_t> n = codec.Decode(step, &out);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) return out;
  }
}

TEST(Crc32cTest, MatchesTheCheckValue) {
  // The CRC-32C check value (RFC 3720, B.4) and the framing format's mask.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(MaskedCrc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(SnappyCodecTest, StartsWithTheStreamIdentifierAndRoundTrips) {
  auto writer = NewSnappyCodec();
  auto reader = NewSnappyCodec();
  std::string wire;
  const std::string a = Sample(200 * 1024);  // several 64 KiB chunks
  ASSERT_TRUE(writer->Encode(a, &wire).ok());
  EXPECT_EQ(wire.substr(0, 10), std::string("\xff\x06\x00\x00sNaPpY", 10));
  const std::string b = "short";
  ASSERT_TRUE(writer->Encode(b, &wire).ok());
  EXPECT_LT(wire.size(), a.size());
  // Fed one byte at a time: chunks split anywhere reassemble.
  std::string out;
  for (char ch : wire) {
    reader->Feed(absl::string_view(&ch, 1));
    out += DecodeAll(*reader, 1 << 20);
  }
  EXPECT_EQ(out, a + b);
}

TEST(SnappyCodecTest, IncompressibleDataIsStoredAndStillChecked) {
  std::string noise;
  uint32_t x = 12345;
  for (int i = 0; i < 1000; ++i) {
    x = x * 1103515245 + 12345;
    noise.push_back(static_cast<char>(x >> 24));
  }
  auto writer = NewSnappyCodec();
  std::string wire;
  ASSERT_TRUE(writer->Encode(noise, &wire).ok());
  EXPECT_EQ(static_cast<unsigned char>(wire[10]), 0x01);  // an uncompressed chunk
  auto reader = NewSnappyCodec();
  reader->Feed(wire);
  EXPECT_EQ(DecodeAll(*reader, 1 << 20), noise);
  // One flipped data byte fails the checksum.
  wire[wire.size() - 1] ^= 1;
  auto strict = NewSnappyCodec();
  strict->Feed(wire);
  std::string out;
  EXPECT_TRUE(absl::IsInvalidArgument(strict->Decode(1 << 20, &out).status()));
}

TEST(SnappyCodecTest, RefusesWhatTheFormatForbids) {
  std::string out;
  {
    auto r = NewSnappyCodec();  // data before the stream identifier
    r->Feed(std::string("\x01\x05\x00\x00\x00\x00\x00\x00x", 9));
    EXPECT_TRUE(absl::IsInvalidArgument(r->Decode(1024, &out).status()));
  }
  {
    auto r = NewSnappyCodec();  // a chunk longer than 64 KiB of data can be, before its body
    r->Feed(std::string("\xff\x06\x00\x00sNaPpY\x01\xff\xff\x01", 14));
    EXPECT_TRUE(absl::IsInvalidArgument(r->Decode(1024, &out).status()));
  }
  {
    auto r = NewSnappyCodec();  // a reserved unskippable chunk type
    r->Feed(std::string("\xff\x06\x00\x00sNaPpY\x02\x00\x00\x00", 14));
    EXPECT_TRUE(absl::IsInvalidArgument(r->Decode(1024, &out).status()));
  }
  {
    auto r = NewSnappyCodec();  // padding and skippable chunks are skipped
    auto w = NewSnappyCodec();
    std::string wire;
    ASSERT_TRUE(w->Encode("after", &wire).ok());
    wire.insert(10, std::string("\xfe\x03\x00\x00"
                                "abc"
                                "\x80\x01\x00\x00"
                                "z",
                                12));
    r->Feed(wire);
    EXPECT_EQ(DecodeAll(*r, 1024), "after");
  }
}

TEST(DeflateCodecTest, RoundTripsEachEncodeCompletely) {
  auto writer = NewDeflateCodec(6);
  auto reader = NewDeflateCodec(6);
  ASSERT_TRUE(writer.ok() && reader.ok());
  for (size_t size : {1, 100, 70000, 300000}) {
    const std::string data = Sample(size);
    std::string wire;
    ASSERT_TRUE((*writer)->Encode(data, &wire).ok());
    // Sync-flushed: everything decodes without further input.
    (*reader)->Feed(wire);
    EXPECT_EQ(DecodeAll(**reader, 1 << 16), data) << size;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(NewDeflateCodec(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(NewDeflateCodec(10).status()));
}

TEST(DeflateCodecTest, AHugeExpansionIsHandedOverInBoundedSteps) {
  auto writer = NewDeflateCodec(9);
  auto reader = NewDeflateCodec(9);
  ASSERT_TRUE(writer.ok() && reader.ok());
  const std::string zeros(16 << 20, '\0');
  std::string wire;
  ASSERT_TRUE((*writer)->Encode(zeros, &wire).ok());
  ASSERT_LT(wire.size(), 64u * 1024);
  (*reader)->Feed(wire);
  size_t total = 0;
  while (true) {
    std::string out;
    absl::StatusOr<size_t> n = (*reader)->Decode(256 * 1024, &out);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_LE(out.size(), 256u * 1024);
    if (*n == 0) break;
    total += *n;
  }
  EXPECT_EQ(total, zeros.size());
}

TEST(DeflateCodecTest, CorruptInputIsRefused) {
  auto reader = NewDeflateCodec(6);
  ASSERT_TRUE(reader.ok());
  (*reader)->Feed(std::string("\xff\xff\xff\xff\xff\xff", 6));
  std::string out;
  EXPECT_TRUE(absl::IsInvalidArgument((*reader)->Decode(1024, &out).status()));
}

}  // namespace
}  // namespace bus::nsq
