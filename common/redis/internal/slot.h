// Internal to the Redis client: Redis Cluster's key-to-slot mapping (the cluster spec's
// HASH_SLOT: CRC16-XMODEM of the key, or of its hash tag, mod 16384) and which argument of a
// command is its key.
//
//   KeySlot("123456789") == 0x31C3
//   KeySlot("{user1000}.following") == KeySlot("{user1000}.followers")
//
// Thread-safety: pure functions.

#ifndef COMMON_REDIS_INTERNAL_SLOT_H_
#define COMMON_REDIS_INTERNAL_SLOT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace bus::redis {

inline constexpr int kSlots = 16384;

// CRC16-XMODEM (polynomial 0x1021, initial 0, no reflection), as the cluster spec's crc16().
uint16_t Crc16(absl::string_view data);

// The slot of `key`: when it holds a '{' followed later by a '}' with at least one byte
// between them, only the bytes between the first '{' and the first '}' after it are hashed
// (the hash tag); otherwise the whole key.
int KeySlot(absl::string_view key);

// The key a command is routed by: for EVAL, EVALSHA, FCALL and FCALL_RO the first key (none
// when numkeys is 0), for commands without keys (PING, SCAN, WAIT, INFO, CLUSTER, SCRIPT, ...)
// none, otherwise the first argument after the command name.
std::optional<absl::string_view> CommandKey(const std::vector<std::string>& args);

}  // namespace bus::redis

#endif  // COMMON_REDIS_INTERNAL_SLOT_H_
