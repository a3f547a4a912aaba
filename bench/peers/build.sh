#!/usr/bin/env bash
# Builds the peer benchmark programs (asynq, Watermill GoChannel, Watermill redis-stream, River)
# into a cache directory and prints that directory. Versions are pinned in go.mod / go.sum;
# modules come through the Go module proxy (`go mod download`). Not part of the product, not run in CI.
#   bash bench/peers/build.sh            # -> $BUS_PEERS_BIN (default ~/.cache/bus-bench-peers)
set -euo pipefail
cd "$(dirname "$0")"
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: go not found (tools/setup.sh installs it)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
out=${BUS_PEERS_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/bus-bench-peers}
mkdir -p "$out"
go mod download
go build -trimpath -o "$out/" ./asynq_bench ./watermill_channel_bench ./watermill_redis_bench \
  ./river_bench
echo "$out"
