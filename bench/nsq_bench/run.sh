#!/usr/bin/env bash
# Runs nsq's bench_writer/bench_reader and the driver's nsq_bench side by side against one
# nsqd on a free loopback port, and prints each rate and our/their ratio.
#   bash bench/nsq_bench/run.sh [runfor=10s]
set -euo pipefail
cd "$(dirname "$0")/../.."
runfor=${1:-10s}
bazel build -c opt //bench/nsq_bench:nsq_bench >/dev/null
ours=bazel-bin/bench/nsq_bench/nsq_bench
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
hport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d)
nsqd --tcp-address=127.0.0.1:$port --http-address=127.0.0.1:$hport --https-address= \
  --data-path="$data" --mem-queue-size=1000000 --log-level=warn >"$data/nsqd.log" 2>&1 &
nsqd_pid=$!
trap 'kill $nsqd_pid 2>/dev/null; wait $nsqd_pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
addr=127.0.0.1:$port
rate() { grep -o 'ops/s: *[0-9.]*\|[0-9.]*ops/s' | grep -o '[0-9.]*' | head -1; }

# Channels first, so both writers' messages flow into a channel as they arrive.
curl -s -X POST "http://127.0.0.1:$hport/channel/create?topic=theirs&channel=ch" >/dev/null
curl -s -X POST "http://127.0.0.1:$hport/channel/create?topic=ours&channel=bus" >/dev/null

their_w=$(nsq_bench_writer --nsqd-tcp-address=$addr --topic=theirs --size=200 --batch-size=200 --runfor=$runfor 2>&1 | rate)
our_w=$($ours --mode=write --nsqd=$addr --topic=ours --size=200 --batch_size=200 --runfor=$runfor | rate)
# Readers run for half as long as the writers did, so neither drains its backlog early.
readfor=$(python3 -c "print(str(float('${runfor%s}')/2)+'s')")
their_r=$(nsq_bench_reader --nsqd-tcp-address=$addr --topic=theirs --channel=ch --size=200 --runfor=$readfor 2>&1 | rate)
our_r=$($ours --mode=read --nsqd=$addr --topic=ours --runfor=$readfor | rate)
echo "publish  msgs/s: bench_writer=$their_w ours=$our_w ratio=$(python3 -c "print(round($our_w/$their_w,3))")"
echo "consume  msgs/s: bench_reader=$their_r ours=$our_r ratio=$(python3 -c "print(round($our_r/$their_r,3))")"
