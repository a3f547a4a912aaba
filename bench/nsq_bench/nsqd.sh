# Sourced by the NSQ benchmark scripts (run.sh, cpu.sh, spread.sh), from the repository root:
# builds nsq_bench -c opt ($ours) and starts nsqd on free loopback ports, each stopped and its
# data removed when the script exits.
#   start_nsqd [nsqd flags...]   # sets $addr (host:port for TCP), $http (its HTTP base URL), $nsqd_pid
bazel build -c opt --jobs=2 //bench/nsq_bench:nsq_bench >/dev/null 2>&1
ours=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/nsq_bench/nsq_bench
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
nsqd_data=$(mktemp -d)
nsqd_pids=()
trap 'for p in "${nsqd_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$nsqd_data"' EXIT
start_nsqd() {
  local port hport dir
  port=$(free_port)
  hport=$(free_port)
  dir=$(mktemp -d "$nsqd_data/nsqd.XXXXXX")
  nsqd --tcp-address=127.0.0.1:$port --http-address=127.0.0.1:$hport --https-address= \
    --data-path="$dir" --mem-queue-size=10000000 --log-level=warn "$@" >"$dir.log" 2>&1 &
  nsqd_pid=$!
  nsqd_pids+=("$nsqd_pid")
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  addr=127.0.0.1:$port
  http=http://127.0.0.1:$hport
}
