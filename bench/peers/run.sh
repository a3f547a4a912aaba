#!/usr/bin/env bash
# Runs our benchmarks and the peers' (asynq, Watermill GoChannel, Watermill redis-stream)
# interleaved against one redis-server, for R rounds, prints every run, and ends with a table:
# what, peer, ours, ratio (medians over the rounds). Method: docs/benchmarks/peers.md.
#
#   bash bench/peers/run.sh [--rounds=3] [--redis_msgs=50000] [--fast_msgs=200000]
#                           [--send_msgs=50000] [--memory_msgs=300000]
#                           [--evalsha_requests=1000000] [--nsq[=10s]]
#
# Each round holds flock on $BENCH_LOCK (default /work/bench.lock), so no other benchmark that
# takes it overlaps a round; builds happen before, outside the lock. redis-server is started on
# a free loopback port with persistence off; FLUSHALL runs before every run. Odd rounds run
# each peer before its counterpart of ours, even rounds after. --nsq also runs
# bench/nsq_bench/run.sh (its own interleaving, against its own nsqd) after the rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 redis_msgs=50000 fast_msgs=200000 send_msgs=50000 memory_msgs=300000
evalsha_requests=1000000 nsq=""
for arg in "$@"; do
  case $arg in
    --rounds=*) rounds=${arg#*=} ;;
    --redis_msgs=*) redis_msgs=${arg#*=} ;;
    --fast_msgs=*) fast_msgs=${arg#*=} ;;
    --send_msgs=*) send_msgs=${arg#*=} ;;
    --memory_msgs=*) memory_msgs=${arg#*=} ;;
    --evalsha_requests=*) evalsha_requests=${arg#*=} ;;
    --nsq) nsq=10s ;;
    --nsq=*) nsq=${arg#*=} ;;
    *) echo "usage: see the head of $0" >&2; exit 2 ;;
  esac
done
lock=${BENCH_LOCK:-/work/bench.lock}

# ---- Build (outside the lock) ----
bazel build -c opt //bench:redis_bench //bench:memory_e2e_bench >/dev/null 2>&1 ||
  { echo "run.sh: bazel build failed" >&2; exit 1; }
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench
peers=$(bash bench/peers/build.sh | tail -1)

# ---- redis-server ----
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d)
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$data" \
  --logfile "$data/redis.log" &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null; wait $redis_pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -p "$port" "$@" >/dev/null; }
addr=127.0.0.1:$port
echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on $addr; $rounds rounds;" \
  "messages: redis e2e $redis_msgs, fast $fast_msgs, sends $send_msgs, memory $memory_msgs"

# The EVALSHA limit: the per-message commands of our reserve script (drivers/redis/
# queue_scripts.h, kReserve, for one message): TIME, HGET of the body, HINCRBY of the
# attempts, ZADD of the lease; 100,000 random ids.
evalsha_script="local t = redis.call('TIME')
local body = redis.call('HGET', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + 30000, ARGV[1])
return body"
# and, for context, a one-command script (as redis_bench --ping_threads --ping_eval).
evalsha_one_script="return redis.call('HGET', KEYS[1], ARGV[1])"

# ---- The runs: name -> command printing a line with rate=R ----
rate_of() { grep -o 'rate=[0-9.]*' | tail -1 | cut -d= -f2; }
memory_rate() { grep -o 'concurrency [0-9]*: [0-9]*' | tail -1 | awk '{print $3}'; }
run() {
  local name=$1
  cli flushall
  local r
  case $name in
    asynq_e2e) r=$("$peers/asynq_bench" -addr "$addr" -mode e2e -msgs "$redis_msgs" -concurrency 8 | rate_of) ;;
    asynq_send) r=$("$peers/asynq_bench" -addr "$addr" -mode send -msgs "$send_msgs" -producers 8 | rate_of) ;;
    wm_redis_e2e) r=$("$peers/watermill_redis_bench" -addr "$addr" -msgs "$redis_msgs" -subscribers 8 | rate_of) ;;
    wm_chan_c1) r=$("$peers/watermill_channel_bench" -msgs "$memory_msgs" -concurrency 1 | rate_of) ;;
    wm_chan_c2) r=$("$peers/watermill_channel_bench" -msgs "$memory_msgs" -concurrency 2 | rate_of) ;;
    ours_e2e_default)
      r=$("$bin/redis_bench" --port="$port" --steps=e2e --concurrency=8 --max_in_flight=0 \
        --handler_batch_size=0 --e2e_messages="$redis_msgs" | rate_of) ;;
    ours_e2e_b1_mif1024)
      r=$("$bin/redis_bench" --port="$port" --steps=e2e --concurrency=8 --max_in_flight=1024 \
        --handler_batch_size=1 --e2e_messages="$redis_msgs" | rate_of) ;;
    ours_e2e_b64 | ours_e2e_b128)
      r=$("$bin/redis_bench" --port="$port" --steps=e2e --concurrency=8 --max_in_flight=1024 \
        --handler_batch_size="${name#ours_e2e_b}" --e2e_messages="$fast_msgs" | rate_of) ;;
    ours_send)
      r=$("$bin/redis_bench" --port="$port" --steps=sends --send_single --producers=8 \
        --messages="$send_msgs" | rate_of) ;;
    ours_mem_c1 | ours_mem_c2)
      r=$("$bin/memory_e2e_bench" --runs=1 --messages="$memory_msgs" \
        --concurrency="${name#ours_mem_c}" | memory_rate) ;;
    evalsha | evalsha_one)
      local sha keys
      if [[ $name == evalsha ]]; then
        sha=$(redis-cli -p "$port" script load "$evalsha_script")
        keys=(3 bench:attempts bench:inflight bench:msgs)
      else
        sha=$(redis-cli -p "$port" script load "$evalsha_one_script")
        keys=(1 bench:msgs)
      fi
      r=$(redis-benchmark -h 127.0.0.1 -p "$port" -P 16 -q -n "$evalsha_requests" -r 100000 \
        evalsha "$sha" "${keys[@]}" __rand_int__ 2>/dev/null |
        tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1) ;;
    *) echo "unknown run $name" >&2; exit 1 ;;
  esac
  r=${r%.*}
  [[ -n $r && $r -gt 0 ]] || { echo "run $name gave no rate" >&2; exit 1; }
  echo "$r"
}

# Rows: what | peer run | ours run | peer label. Each pair runs peer then ours (odd rounds) or
# ours then peer (even rounds); a run shared by two rows runs once per round.
rows=(
  "Redis end to end, HandlerOptions defaults (batch_size 0: chosen, max in flight 0: 64 per worker), concurrency 8|asynq_e2e|ours_e2e_default|asynq v0.26.0 Server, concurrency 8"
  "Redis end to end, HandlerOptions defaults (batch_size 0: chosen, max in flight 0: 64 per worker), concurrency 8|wm_redis_e2e|ours_e2e_default|Watermill redis-stream v1.4.5, 8 subscribers"
  "Redis end to end, batch_size 1, max in flight 1024, concurrency 8|wm_redis_e2e|ours_e2e_b1_mif1024|Watermill redis-stream v1.4.5, 8 subscribers"
  "Redis end to end, batch_size 64, max in flight 1024, concurrency 8|asynq_e2e|ours_e2e_b64|asynq v0.26.0 Server, concurrency 8"
  "Redis end to end, batch_size 128, max in flight 1024, concurrency 8|asynq_e2e|ours_e2e_b128|asynq v0.26.0 Server, concurrency 8"
  "Redis end to end, batch_size 64, vs the server's EVALSHA -P 16|evalsha|ours_e2e_b64|redis-benchmark -P 16 EVALSHA (reserve-like script)"
  "Redis end to end, batch_size 128, vs the server's EVALSHA -P 16|evalsha|ours_e2e_b128|redis-benchmark -P 16 EVALSHA (reserve-like script)"
  "Redis end to end, batch_size 64, vs the server's EVALSHA -P 16 of a one-command script|evalsha_one|ours_e2e_b64|redis-benchmark -P 16 EVALSHA (HGET script)"
  "Redis sends, one message per call, 8 threads|asynq_send|ours_send|asynq v0.26.0 Client.Enqueue x 8 goroutines"
  "memory driver + memory stores, concurrency 1|wm_chan_c1|ours_mem_c1|Watermill v1.5.1 GoChannel router, 1 handler"
  "memory driver + memory stores, concurrency 2|wm_chan_c2|ours_mem_c2|Watermill v1.5.1 GoChannel router, 2 handlers"
)
results=$(mktemp)
for r in $(seq "$rounds"); do
  exec 9>"$lock"
  flock 9
  echo "== round $r ($( ((r % 2)) && echo peers-first || echo ours-first), load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M:%S) UTC)"
  declare -A got=()
  for row in "${rows[@]}"; do
    IFS='|' read -r _ peer ours _ <<<"$row"
    if ((r % 2)); then order=("$peer" "$ours"); else order=("$ours" "$peer"); fi
    for name in "${order[@]}"; do
      [[ -n ${got[$name]:-} ]] && continue
      got[$name]=$(run "$name")
      printf '  %-20s %10s msg/s\n' "$name" "${got[$name]}"
      echo "$r $name ${got[$name]}" >>"$results"
    done
  done
  flock -u 9
  unset got
done

echo
echo "| what | peer | peer msg/s | ours msg/s | ratio |"
echo "|---|---|---|---|---|"
ROWS=$(printf '%s\n' "${rows[@]}") python3 - "$results" <<'EOF'
import os, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, name, rate = line.split()
    runs.setdefault(name, {})[int(r)] = float(rate)
for row in os.environ["ROWS"].splitlines():
    what, peer, ours, label = row.split("|")
    rs = sorted(set(runs[peer]) & set(runs[ours]))
    ratios = [runs[ours][r] / runs[peer][r] for r in rs]
    p = statistics.median(runs[peer].values())
    o = statistics.median(runs[ours].values())
    print(f"| {what} | {label} | {p:,.0f} | {o:,.0f} | {statistics.median(ratios):.2f} "
          f"({', '.join(f'{x:.2f}' for x in ratios)}) |")
EOF
echo "(medians of $rounds rounds; ratio = median of the per-round ratios ours/peer, each round's in brackets)"
rm -f "$results"

if [[ -n $nsq ]]; then
  echo
  echo "== NSQ: bench/nsq_bench/run.sh $nsq"
  exec 9>"$lock"
  flock 9
  bash bench/nsq_bench/run.sh "$nsq"
  flock -u 9
fi
