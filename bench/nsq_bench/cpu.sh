#!/usr/bin/env bash
# Where the CPU goes when publishing and consuming at full speed: runs nsq's bench_writer /
# bench_reader and the driver's nsq_bench, one after the other, against one nsqd on a free
# loopback port, and prints for each run its rate and the CPU (in cores: CPU seconds / wall
# seconds) that nsqd and the client used. On a machine with N cores, nsqd + client near N means
# the machine is the limit; nsqd's share says how much of it nsqd needs at that rate.
#   bash bench/nsq_bench/cpu.sh [runfor=5s]
set -euo pipefail
cd "$(dirname "$0")/../.."
runfor=${1:-5s}
source bench/nsq_bench/nsqd.sh
start_nsqd
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# run NAME CMD...: the client's rate, its CPU and nsqd's, in cores.
run() {
  local name=$1
  shift
  local n0 t0 out n1 t1 cpu
  n0=$(ticks $nsqd_pid)
  t0=$(date +%s.%N)
  out=$(/usr/bin/time -f 'cpu %U %S' "$@" 2>&1)
  t1=$(date +%s.%N)
  n1=$(ticks $nsqd_pid)
  cpu=$(grep -o 'cpu [0-9.]* [0-9.]*' <<<"$out" | tail -1)
  rate=$(grep -o 'ops/s: *[0-9.]*\|[0-9.]*ops/s' <<<"$out" | grep -o '[0-9.]*' | head -1)
  python3 - "$name" "$rate" "$t0" "$t1" "$n0" "$n1" "$hz" $cpu <<'PY'
import sys
name, rate, t0, t1, n0, n1, hz, _, user, sys_ = sys.argv[1:]
wall = float(t1) - float(t0)
nsqd = (float(n1) - float(n0)) / float(hz) / wall
client = (float(user) + float(sys_)) / wall
print(f"{name:14s} {float(rate):>12,.0f} msgs/s  nsqd {nsqd:4.2f} cores  client {client:4.2f} cores"
      f"  (sum {nsqd + client:4.2f}; {wall:.1f} s)")
PY
}
nsq_bench_writer --nsqd-tcp-address=$addr --topic=warmup --size=200 --batch-size=200 --runfor=2s >/dev/null 2>&1
run bench_writer nsq_bench_writer --nsqd-tcp-address=$addr --topic=theirs --size=200 --batch-size=200 --runfor=$runfor
run ours_write $ours --mode=write --nsqd=$addr --topic=ours --size=200 --batch_size=200 --runfor=$runfor
curl -sf -X POST "$http/topic/delete?topic=theirs" >/dev/null
curl -sf -X POST "$http/topic/delete?topic=ours" >/dev/null
curl -sf -X POST "$http/topic/create?topic=c" >/dev/null
curl -sf -X POST "$http/channel/create?topic=c&channel=ch" >/dev/null
curl -sf -X POST "$http/channel/create?topic=c&channel=bus" >/dev/null
$ours --mode=write --nsqd=$addr --topic=c --size=200 --batch_size=200 --count=4000000 --runfor=120s >/dev/null
# Until nsqd has copied the backlog into both channels.
for _ in $(seq 600); do
  d=$(curl -sf "$http/stats?format=json&topic=c" | python3 -c '
import json, sys
t = json.load(sys.stdin)["topics"][0]
print(t["depth"] + t["backend_depth"])')
  [[ $d == 0 ]] && break
  sleep 0.1
done
run bench_reader nsq_bench_reader --nsqd-tcp-address=$addr --topic=c --channel=ch --size=200 --runfor=$runfor
run ours_read $ours --mode=read --nsqd=$addr --topic=c --runfor=$runfor
