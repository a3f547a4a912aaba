#!/usr/bin/env bash
# Runs the NATS driver end to end (bench/nats_bench.cc: a Handler at the defaults, no-op handle,
# memory stores) beside its Go peer (bench/peers/nats: nats.go JetStream pull consumers, 8
# workers, Fetch 64, AckSync as the driver's acks, and plain Ack for reference) and the server's
# limit (`nats bench` from github.com/nats-io/natscli: JetStream publish, then a pull consumer
# with explicit acks), interleaved for R rounds against one nats-server started here, and
# prints the medians and ratios. Method and figures: docs/benchmarks/nats.md.
#
#   bash bench/peers/run_nats.sh [--rounds=3] [--msgs=50000]
#
# The server: `nats-server -js -sd <tmp> -a 127.0.0.1 -p <free port>` (tools/setup_nats.sh
# builds it). Each round holds flock on $BENCH_LOCK (default /tmp/bench.lock); builds happen
# before, outside the lock. Not part of the product, not run in CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 msgs=50000
for arg in "$@"; do
  case $arg in
    --rounds=*) rounds=${arg#*=} ;;
    --msgs=*) msgs=${arg#*=} ;;
    *) echo "usage: see the head of $0" >&2; exit 2 ;;
  esac
done
lock=${BENCH_LOCK:-/tmp/bench.lock}
natscli_version=v0.5.1
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
out=${BUS_PEERS_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/bus-bench-peers}/nats
mkdir -p "$out"

# ---- Build (outside the lock) ----
bazel build -c opt --jobs=2 //bench:nats_bench >/dev/null 2>&1 ||
  { echo "run_nats.sh: bazel build failed" >&2; exit 1; }
ours=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/nats_bench
(cd bench/peers/nats && go build -trimpath -o "$out/" ./jetstream_bench)
[ -x "$out/nats" ] || GOBIN="$out" go install "github.com/nats-io/natscli/nats@$natscli_version"

# ---- nats-server ----
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d /tmp/bus-bench-nats-XXXXXX)
nats-server -js -sd "$data" -a 127.0.0.1 -p "$port" >"$data/server.log" 2>&1 &
server_pid=$!
trap 'kill $server_pid 2>/dev/null; wait $server_pid 2>/dev/null; rm -rf "$data"' EXIT
url="nats://127.0.0.1:$port"
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
echo "$(nats-server --version) on 127.0.0.1:$port; $rounds rounds of $msgs messages (100 bytes)"

# ---- The runs: name -> messages per second ----
rate_of() { grep -o 'rate=[0-9.]*' | tail -1 | cut -d= -f2; }
run() {
  case $1 in
    ours) "$ours" --url="$url" --messages="$msgs" | grep 'mode=e2e' | rate_of ;;
    gosync) "$out/jetstream_bench" -url "$url" -msgs "$msgs" -ack sync | rate_of ;;
    goasync) "$out/jetstream_bench" -url "$url" -msgs "$msgs" -ack async | rate_of ;;
    natsbench)
      # JetStream publish (async, not timed here), then its fetch consumer at its defaults (batches
      # of 500, explicit acks not awaited): the most this server consumes.
      local stream="NB$RANDOM"
      "$out/nats" -s "$url" bench js pub async "$stream.x" --stream "$stream" --create \
        --msgs "$msgs" --size 100B --no-progress >/dev/null
      "$out/nats" -s "$url" bench js fetch --stream "$stream" --msgs "$msgs" \
        --acks explicit --no-progress 2>&1 | grep -o "stats: [0-9,]* msgs/sec" | tr -dc 0-9
      "$out/nats" -s "$url" stream rm -f "$stream" >/dev/null ;;
  esac
}
names=(ours gosync goasync natsbench)
declare -A rates
for r in $(seq "$rounds"); do
  exec 9>"$lock"
  flock 9
  for n in "${names[@]}"; do
    rate=$(run "$n")
    rates[$n]="${rates[$n]:-} $rate"
    echo "round $r: $n $rate"
  done
  flock -u 9
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ours_m=$(echo "${rates[ours]}" | median)
printf '%-44s %10s %10s %6s\n' what peer ours ratio
for n in gosync goasync natsbench; do
  peer_m=$(echo "${rates[$n]}" | median)
  case $n in
    gosync) what="e2e vs nats.go (AckSync, 8 workers)" ;;
    goasync) what="e2e vs nats.go (Ack, 8 workers)" ;;
    natsbench) what="e2e vs nats bench js fetch (limit)" ;;
  esac
  printf '%-44s %10s %10s %6.2f\n' "$what" "$peer_m" "$ours_m" "$(echo "$ours_m / $peer_m" | bc -l)"
done
