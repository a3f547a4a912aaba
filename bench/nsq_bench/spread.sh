#!/usr/bin/env bash
# Publishing rate of the NSQ driver to two nsqd with publish_policy=spread against one nsqd,
# same workload (nsq_bench --mode=write: MPUBs of 200 messages of 200 bytes from 2 threads,
# no channel, so nothing reads), on free loopback ports. Runs one, two, two, one (runfor each)
# so order effects fall on both sides; prints each run, the means and the ratio.
#   flock /tmp/bench.lock bash bench/nsq_bench/spread.sh [runfor=10s]
set -euo pipefail
cd "$(dirname "$0")/../.."
runfor=${1:-10s}
source bench/nsq_bench/nsqd.sh
addrs=()
https=()
for _ in 1 2; do
  start_nsqd
  addrs+=("$addr")
  https+=("$http")
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
