#!/usr/bin/env bash
# Publishing rate of the NSQ driver to two nsqd with publish_policy=spread against one nsqd,
# same workload (nsq_bench --mode=write: MPUBs of 200 messages of 200 bytes from 2 threads,
# no channel, so nothing reads), on free loopback ports. Runs one, two, two, one (runfor each)
# so order effects fall on both sides; prints each run, the means and the ratio.
#   flock /work/bench.lock bash bench/nsq_bench/spread.sh [runfor=10s]
set -euo pipefail
cd "$(dirname "$0")/../.."
runfor=${1:-10s}
bazel build -c opt //bench/nsq_bench:nsq_bench >/dev/null 2>&1
ours=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/nsq_bench/nsq_bench
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
data=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; wait $p 2>/dev/null; done; rm -rf "$data"' EXIT
addrs=()
https=()
for n in 1 2; do
  port=$(free_port); hport=$(free_port)
  mkdir -p "$data/$n"
  nsqd --tcp-address=127.0.0.1:$port --http-address=127.0.0.1:$hport --https-address= \
    --data-path="$data/$n" --mem-queue-size=10000000 --log-level=warn >"$data/$n.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  addrs+=(127.0.0.1:$port)
  https+=(http://127.0.0.1:$hport)
done
rate() { grep -o 'ops/s: *[0-9.]*' | grep -o '[0-9.]*$' | cut -d. -f1; }
mean() { python3 -c "import sys; v=[float(x) for x in sys.argv[1:]]; print(round(sum(v)/len(v)))" "$@"; }
run() { $ours --mode=write --nsqd="$1" --publish_policy=spread --topic="$2" --size=200 --batch_size=200 --runfor=$runfor | rate; }
clean() { for h in "${https[@]}"; do curl -sf -X POST "$h/topic/delete?topic=$1" >/dev/null || true; done; }
one=${addrs[0]}
two=${addrs[0]},${addrs[1]}
run "$two" warmup >/dev/null; clean warmup
o1=$(run "$one" t1); clean t1
t1=$(run "$two" t2); clean t2
t2=$(run "$two" t3); clean t3
o2=$(run "$one" t4); clean t4
om=$(mean $o1 $o2); tm=$(mean $t1 $t2)
echo "publish msgs/s: one nsqd=$om ($o1, $o2) two nsqd spread=$tm ($t1, $t2) ratio=$(python3 -c "print(round($tm/$om,3))")"
