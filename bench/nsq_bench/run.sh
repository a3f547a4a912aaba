#!/usr/bin/env bash
# Runs nsq's bench_writer/bench_reader and the driver's nsq_bench side by side against one
# nsqd on a free loopback port, and prints each rate and our/their ratio.
#   bash bench/nsq_bench/run.sh [runfor=10s]
# Each side runs twice in the order theirs, ours, ours, theirs (runfor/2 per write run,
# runfor/4 per read run, so neither reader drains its backlog), and a side's rate is the mean
# of its two runs: the order effects (nsqd warming up, its garbage collection) then fall on
# both sides alike.
set -euo pipefail
cd "$(dirname "$0")/../.."
runfor=${1:-10s}
secs=${runfor%s}
half=$(python3 -c "print(str($secs/2)+'s')")
quarter=$(python3 -c "print(str($secs/4)+'s')")
bazel build -c opt //bench/nsq_bench:nsq_bench >/dev/null 2>&1
ours=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/nsq_bench/nsq_bench
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
hport=$(free_port)
data=$(mktemp -d)
nsqd --tcp-address=127.0.0.1:$port --http-address=127.0.0.1:$hport --https-address= \
  --data-path="$data" --mem-queue-size=10000000 --log-level=warn >"$data/nsqd.log" 2>&1 &
nsqd_pid=$!
trap 'kill $nsqd_pid 2>/dev/null; wait $nsqd_pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
addr=127.0.0.1:$port
rate() { grep -o 'ops/s: *[0-9.]*\|[0-9.]*ops/s' | grep -o '[0-9.]*' | head -1; }
mean() { python3 -c "print(round(($1+$2)/2))"; }

# Channels first, so the writers' messages flow into a channel as they arrive.
curl -s -X POST "http://127.0.0.1:$hport/channel/create?topic=theirs&channel=ch" >/dev/null
curl -s -X POST "http://127.0.0.1:$hport/channel/create?topic=ours&channel=bus" >/dev/null

their_write() { nsq_bench_writer --nsqd-tcp-address=$addr --topic=theirs --size=200 --batch-size=200 --runfor=$half 2>&1 | rate; }
our_write() { $ours --mode=write --nsqd=$addr --topic=ours --size=200 --batch_size=200 --runfor=$half | rate; }
their_read() { nsq_bench_reader --nsqd-tcp-address=$addr --topic=theirs --channel=ch --size=200 --runfor=$quarter 2>&1 | rate; }
our_read() { $ours --mode=read --nsqd=$addr --topic=ours --runfor=$quarter | rate; }

# Warm-up (discarded): nsqd's first seconds are unlike the rest.
nsq_bench_writer --nsqd-tcp-address=$addr --topic=warmup --size=200 --batch-size=200 --runfor=2s >/dev/null 2>&1
$ours --mode=write --nsqd=$addr --topic=warmup2 --size=200 --batch_size=200 --runfor=2s >/dev/null
tw1=$(their_write); ow1=$(our_write); ow2=$(our_write); tw2=$(their_write)
tr1=$(their_read); or1=$(our_read); or2=$(our_read); tr2=$(their_read)
tw=$(mean $tw1 $tw2); ow=$(mean $ow1 $ow2); tr=$(mean $tr1 $tr2); or=$(mean $or1 $or2)
echo "publish  msgs/s: bench_writer=$tw ($tw1, $tw2) ours=$ow ($ow1, $ow2) ratio=$(python3 -c "print(round($ow/$tw,3))")"
echo "consume  msgs/s: bench_reader=$tr ($tr1, $tr2) ours=$or ($or1, $or2) ratio=$(python3 -c "print(round($or/$tr,3))")"
