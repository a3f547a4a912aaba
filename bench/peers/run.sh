#!/usr/bin/env bash
# Runs our benchmarks and the peers' (asynq, BullMQ, Watermill redis-stream, Watermill GoChannel)
# interleaved against one redis-server, for R rounds, prints every run, and ends with a table:
# what, peer, rates, ratio, and what each side cost redis-server per message (medians over the
# rounds). Method: docs/benchmarks/peers.md.
#
#   bash bench/peers/run.sh [--rounds=3] [--redis_msgs=50000] [--send_msgs=50000]
#                           [--memory_msgs=300000] [--nsq[=10s]]
#
# Every side of a ratio handles the same number of messages: --redis_msgs for every Redis end to
# end row (and the EVALSHA requests), --send_msgs for the send rows, --memory_msgs for the memory
# rows. Every side stops its clock when the broker has settled the last message (ours: the ack
# accepted; asynq: its done script's reply; BullMQ: the Worker's 'completed' event, after its
# moveToFinished script; Watermill redis-stream: the XACK replies; GoChannel: Message.Ack).
# Every Redis run prints a `server phase=...` line: redis-server's CPU (INFO cpu, user + sys)
# and commands (INFO commandstats) over its timed phase, per message.
#
# Each round holds flock on $BENCH_LOCK (default /tmp/bench.lock), so no other benchmark that
# takes it overlaps a round; builds happen before, outside the lock. redis-server is started on
# a free loopback port with persistence off; FLUSHALL runs before every run. Odd rounds run
# each peer before its counterpart of ours, even rounds after. --nsq also runs
# bench/nsq_bench/run.sh (its own interleaving, against its own nsqd) after the rounds.
# $RUN_LOG (default: a temporary file, removed) keeps every run's full output.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 redis_msgs=50000 send_msgs=50000 memory_msgs=300000 nsq=""
for arg in "$@"; do
  case $arg in
    --rounds=*) rounds=${arg#*=} ;;
    --redis_msgs=*) redis_msgs=${arg#*=} ;;
    --send_msgs=*) send_msgs=${arg#*=} ;;
    --memory_msgs=*) memory_msgs=${arg#*=} ;;
    --nsq) nsq=10s ;;
    --nsq=*) nsq=${arg#*=} ;;
    *) echo "usage: see the head of $0" >&2; exit 2 ;;
  esac
done
lock=${BENCH_LOCK:-/tmp/bench.lock}

# ---- Build (outside the lock) ----
bazel build -c opt --jobs=2 //bench:redis_bench //bench:memory_e2e_bench >/dev/null 2>&1 ||
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
log=${RUN_LOG:-$data/runs.log}
echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on $addr; $rounds rounds;" \
  "messages: redis e2e $redis_msgs, sends $send_msgs, memory $memory_msgs"

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

# server_phase PHASE N BEFORE AFTER: the `server phase=...` line (as bench/redis_server_stats.h
# prints it) from two `INFO cpu commandstats` texts, for the EVALSHA runs.
server_phase() {
  python3 - "$@" <<'EOF_PY'
import sys, time
phase, n, before, after = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def parse(path):
    cpu, calls = 0.0, {}
    for line in open(path):
        k, _, v = line.strip().partition(":")
        if k in ("used_cpu_user", "used_cpu_sys"):
            cpu += float(v)
        elif k.startswith("cmdstat_"):
            calls[k[8:]] = int(v.split(",")[0].split("=")[1])
    return cpu, calls
(c0, k0), (c1, k1) = parse(before), parse(after)
scripts = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
d = {k: v - k0.get(k, 0) for k, v in k1.items() if k != "info" and v - k0.get(k, 0) > 0}
cmds = sum(v for k, v in d.items() if k not in scripts)
top = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
print(f"server phase={phase} msgs={n} cpu_s={c1 - c0:.3f} cpu_us_per_msg={(c1 - c0) * 1e6 / n:.1f} "
      f"cmds_per_msg={cmds / n:.2f} scripts_per_msg={sum(v for k, v in d.items() if k in scripts) / n:.3f} "
      f"top={','.join(f'{k}:{v / n:.2f}' for k, v in top)}")
EOF_PY
}

# ---- The runs: name -> command printing a line with rate=R (and, on Redis, server ...) ----
run_cmd() {
  local name=$1
  case $name in
    asynq_e2e) "$peers/asynq_bench" -addr "$addr" -mode e2e -msgs "$redis_msgs" -concurrency 8 ;;
    asynq_send) "$peers/asynq_bench" -addr "$addr" -mode send -msgs "$send_msgs" -producers 8 ;;
    bullmq_e2e) node "$peers/bullmq_bench/main.js" --addr="$addr" --mode=e2e --msgs="$redis_msgs" --concurrency=8 ;;
    bullmq_send) node "$peers/bullmq_bench/main.js" --addr="$addr" --mode=send --msgs="$send_msgs" --producers=8 ;;
    wm_redis_e2e) "$peers/watermill_redis_bench" -addr "$addr" -msgs "$redis_msgs" -subscribers 8 ;;
    wm_chan_c1) "$peers/watermill_channel_bench" -msgs "$memory_msgs" -concurrency 1 ;;
    wm_chan_c2) "$peers/watermill_channel_bench" -msgs "$memory_msgs" -concurrency 2 ;;
    ours_e2e_default)
      "$bin/redis_bench" --port="$port" --steps=e2e --concurrency=8 --max_in_flight=0 \
        --handler_batch_size=0 --e2e_messages="$redis_msgs" ;;
    ours_e2e_b1_mif1024)
      "$bin/redis_bench" --port="$port" --steps=e2e --concurrency=8 --max_in_flight=1024 \
        --handler_batch_size=1 --e2e_messages="$redis_msgs" ;;
    ours_e2e_b64 | ours_e2e_b128)
      "$bin/redis_bench" --port="$port" --steps=e2e --concurrency=8 --max_in_flight=1024 \
        --handler_batch_size="${name#ours_e2e_b}" --e2e_messages="$redis_msgs" ;;
    ours_send)
      "$bin/redis_bench" --port="$port" --steps=sends --send_single --producers=8 \
        --messages="$send_msgs" ;;
    ours_mem_c1 | ours_mem_c2)
      "$bin/memory_e2e_bench" --runs=1 --messages="$memory_msgs" \
        --concurrency="${name#ours_mem_c}" |
        sed -n 's/.*concurrency [0-9]*: \([0-9]*\).*/&\nrate=\1/p' ;;
    ours_mem_work_c1 | ours_mem_work_c2)
      "$bin/memory_e2e_bench" --runs=1 --messages="$memory_msgs" --handler_work_ns=5000 \
        --concurrency="${name#ours_mem_work_c}" |
        sed -n 's/.*concurrency [0-9]*: \([0-9]*\).*/&\nrate=\1/p' ;;
    evalsha | evalsha_one)
      local sha keys
      if [[ $name == evalsha ]]; then
        sha=$(redis-cli -p "$port" script load "$evalsha_script")
        keys=(3 bench:attempts bench:inflight bench:msgs)
      else
        sha=$(redis-cli -p "$port" script load "$evalsha_one_script")
        keys=(1 bench:msgs)
      fi
      redis-cli -p "$port" info cpu commandstats >"$data/before"
      redis-benchmark -h 127.0.0.1 -p "$port" -P 16 -q -n "$redis_msgs" -r 100000 \
        evalsha "$sha" "${keys[@]}" __rand_int__ 2>/dev/null |
        tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 |
        sed 's/^\([0-9]*\).*/rate=\1/'
      redis-cli -p "$port" info cpu commandstats >"$data/after"
      server_phase evalsha "$redis_msgs" "$data/before" "$data/after" ;;
    *) echo "unknown run $name" >&2; exit 1 ;;
  esac
}
# run NAME: prints "rate cpu_us_per_msg cmds_per_msg busy" ("-" for what the run has not).
run() {
  local name=$1 out
  cli flushall
  out=$(run_cmd "$name") || { echo "run $name failed: $out" >&2; exit 1; }
  printf '== %s\n%s\n' "$name" "$out" >>"$log"
  local rate cpu cmds busy
  rate=$(grep -o 'rate=[0-9.]*' <<<"$out" | tail -1 | cut -d= -f2)
  rate=${rate%.*}
  [[ -n $rate && $rate -gt 0 ]] || { echo "run $name gave no rate: $out" >&2; exit 1; }
  field() { grep '^server phase=' <<<"$out" | tail -1 | grep -o " $1=[0-9.]*" | cut -d= -f2; }
  cpu=$(field cpu_us_per_msg) cmds=$(field cmds_per_msg) busy=$(field busy)
  echo "$rate ${cpu:--} ${cmds:--} ${busy:--}"
}

# Rows: what | peer run | ours run | peer label. Each pair runs peer then ours (odd rounds) or
# ours then peer (even rounds); a run shared by rows runs once per round.
defaults="Redis end to end, HandlerOptions defaults (batch_size 0: chosen, up to 64; max_in_flight 0: 64 per worker), concurrency 8"
sends="Redis sends, one message per SendToQueue call from 8 threads (the driver merges concurrent calls to a queue into one script run)"
rows=(
  "$defaults|asynq_e2e|ours_e2e_default|asynq v0.26.0 Server, concurrency 8"
  "$defaults|wm_redis_e2e|ours_e2e_default|Watermill redis-stream v1.4.5, 8 subscribers"
  "$defaults|bullmq_e2e|ours_e2e_default|BullMQ 6.7.0 Worker, concurrency 8"
  "Redis end to end, batch_size 1, max_in_flight 1024, concurrency 8|wm_redis_e2e|ours_e2e_b1_mif1024|Watermill redis-stream v1.4.5, 8 subscribers"
  "Redis end to end, batch_size 64, max_in_flight 1024, concurrency 8|asynq_e2e|ours_e2e_b64|asynq v0.26.0 Server, concurrency 8"
  "Redis end to end, batch_size 128, max_in_flight 1024, concurrency 8|asynq_e2e|ours_e2e_b128|asynq v0.26.0 Server, concurrency 8"
  "Redis end to end, batch_size 64, vs the server's EVALSHA -P 16|evalsha|ours_e2e_b64|redis-benchmark -P 16 EVALSHA (reserve-like script)"
  "Redis end to end, batch_size 128, vs the server's EVALSHA -P 16|evalsha|ours_e2e_b128|redis-benchmark -P 16 EVALSHA (reserve-like script)"
  "Redis end to end, batch_size 64, vs the server's EVALSHA -P 16 of a one-command script|evalsha_one|ours_e2e_b64|redis-benchmark -P 16 EVALSHA (HGET script)"
  "$sends|asynq_send|ours_send|asynq v0.26.0 Client.Enqueue x 8 goroutines"
  "$sends|bullmq_send|ours_send|BullMQ 6.7.0 Queue.add x 8 async callers"
  "memory driver + memory stores, concurrency 1|wm_chan_c1|ours_mem_c1|Watermill v1.5.1 GoChannel router, 1 handler"
  "memory driver + memory stores, concurrency 2|wm_chan_c2|ours_mem_c2|Watermill v1.5.1 GoChannel router, 2 handlers"
  "memory driver + memory stores, concurrency 2, no-op handler|ours_mem_c1|ours_mem_c2|ours, concurrency 1"
  "memory driver + memory stores, concurrency 2, 5 us of handler CPU per message|ours_mem_work_c1|ours_mem_work_c2|ours, concurrency 1, the same handler"
)
results=$(mktemp)
for r in $(seq "$rounds"); do
  exec 9>"$lock"
  flock 9
  echo "== round $r ($( ((r % 2)) && echo peers-first || echo ours-first), load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M:%S) UTC)"
  echo "== round $r" >>"$log"
  declare -A got=()
  for row in "${rows[@]}"; do
    IFS='|' read -r _ peer ours _ <<<"$row"
    if ((r % 2)); then order=("$peer" "$ours"); else order=("$ours" "$peer"); fi
    for name in "${order[@]}"; do
      [[ -n ${got[$name]:-} ]] && continue
      got[$name]=$(run "$name")
      read -r rate cpu cmds busy <<<"${got[$name]}"
      printf '  %-20s %10s msg/s   server: %6s us/msg %6s cmds/msg busy %s\n' "$name" "$rate" \
        "$cpu" "$cmds" "$busy"
      echo "$r $name ${got[$name]}" >>"$results"
    done
  done
  echo "   (load after the round: $(cut -d' ' -f1-3 /proc/loadavg))"
  flock -u 9
  unset got
done

echo
echo "| what | peer | peer msg/s | ours msg/s | ratio (rounds) | server µs/msg peer / ours | server cmds/msg peer / ours |"
echo "|---|---|---|---|---|---|---|"
ROWS=$(printf '%s\n' "${rows[@]}") python3 - "$results" <<'EOF_PY'
import os, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, name, rate, cpu, cmds, busy = line.split()
    runs.setdefault(name, {})[int(r)] = (float(rate), cpu, cmds)
def med(name, i):
    xs = [float(v[i]) for v in runs[name].values() if v[i] != "-"]
    return statistics.median(xs) if xs else None
def fmt(x, spec):
    return "—" if x is None else format(x, spec)
for row in os.environ["ROWS"].splitlines():
    what, peer, ours, label = row.split("|")
    rs = sorted(set(runs[peer]) & set(runs[ours]))
    ratios = [runs[ours][r][0] / runs[peer][r][0] for r in rs]
    print(f"| {what} | {label} | {med(peer, 0):,.0f} | {med(ours, 0):,.0f} | "
          f"{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)}) | "
          f"{fmt(med(peer, 1), '.1f')} / {fmt(med(ours, 1), '.1f')} | "
          f"{fmt(med(peer, 2), '.2f')} / {fmt(med(ours, 2), '.2f')} |")
EOF_PY
echo "(medians of $rounds rounds; ratio = median of the per-round ratios ours/peer, each round's in" \
  "brackets; server = redis-server CPU (user + sys) and commands over the timed phase, per message)"
rm -f "$results"

if [[ -n $nsq ]]; then
  echo
  echo "== NSQ: bench/nsq_bench/run.sh $nsq"
  exec 9>"$lock"
  flock 9
  bash bench/nsq_bench/run.sh "$nsq"
  flock -u 9
fi
