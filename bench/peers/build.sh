#!/usr/bin/env bash
# Builds the peer benchmark programs into a cache directory and prints that directory: asynq,
# Watermill GoChannel, Watermill redis-stream, River and the stream-model prototype (Go; versions pinned in go.mod / go.sum, modules
# through the Go module proxy with `go mod download`), and BullMQ (Node; bullmq_bench/, versions
# pinned in its package-lock.json, installed with `npm ci` into <dir>/bullmq_bench, run as
# `node <dir>/bullmq_bench/main.js`). Not part of the product, not run in CI.
#   bash bench/peers/build.sh            # -> $BUS_PEERS_BIN (default ~/.cache/bus-bench-peers)
set -euo pipefail
cd "$(dirname "$0")"
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: go not found (tools/setup_tests.sh installs it)" >&2; exit 1; }
command -v npm >/dev/null || { echo "build.sh: npm not found (Node.js and npm are needed)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
out=${BUS_PEERS_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/bus-bench-peers}
mkdir -p "$out/bullmq_bench"
go mod download
go build -trimpath -o "$out/" ./asynq_bench ./watermill_channel_bench ./watermill_redis_bench \
  ./river_bench ./stream_model_bench
# npm ci only when the lock file changed since the last install.
if ! cmp -s bullmq_bench/package-lock.json "$out/bullmq_bench/package-lock.json" ||
  [ ! -d "$out/bullmq_bench/node_modules" ]; then
  cp bullmq_bench/package.json bullmq_bench/package-lock.json "$out/bullmq_bench/"
  (cd "$out/bullmq_bench" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
cp bullmq_bench/main.js "$out/bullmq_bench/"
echo "$out"
