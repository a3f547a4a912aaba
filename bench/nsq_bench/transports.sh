#!/usr/bin/env bash
# Consume throughput and CPU per message of the driver over each transport, side by side in one
# run against one nsqd on a free loopback port (started with --tls-cert/--tls-key, TLS not
# required, so every mode shares it): plain, snappy, deflate, tls, tls+snappy.
#   bash bench/nsq_bench/transports.sh [runfor=3s] [fill=1500000]
#
# A throwaway CA and server certificate for 127.0.0.1 are made with `openssl` in a temporary
# directory (removed at exit). Each run reads a fresh topic filled with `fill` 200-byte
# messages by our writer (plaintext; the fill is not measured) for `runfor`; the modes run in
# the order plain..tls+snappy, then again in reverse, and a mode's rate is the mean of its two
# runs. CPU per message is the reader process's user+system CPU over the messages it acked, and
# nsqd's CPU over the same messages (from /proc). Fails if a run emptied its topic (use a
# bigger fill).
set -euo pipefail
cd "$(dirname "$0")/../.."
runfor=${1:-3s}
fill=${2:-1500000}
source bench/nsq_bench/nsqd.sh
certs=$(mktemp -d)
trap 'for p in "${nsqd_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$nsqd_data" "$certs"' EXIT
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$certs/ca.key" -out "$certs/ca.pem" -days 1 \
  -subj /CN=bench-ca 2>/dev/null
openssl req "${ec[@]}" -keyout "$certs/server.key" -out "$certs/server.csr" -subj /CN=localhost 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$certs/ext"
openssl x509 -req -in "$certs/server.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" \
  -CAcreateserial -out "$certs/server.pem" -days 1 -extfile "$certs/ext" 2>/dev/null
start_nsqd --tls-cert="$certs/server.pem" --tls-key="$certs/server.key"
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
post() { curl -sf -X POST "$http/$1" >/dev/null; }
depth() {
  curl -sf "$http/stats?format=json&topic=$1" | python3 -c '
import json, sys
t = json.load(sys.stdin)["topics"][0]
c = t["channels"][0]
print(t["depth"] + t["backend_depth"], c["depth"] + c["backend_depth"])'
}
flags_of() {
  case $1 in
    plain) echo "" ;;
    snappy) echo "--compression=snappy" ;;
    deflate) echo "--compression=deflate" ;;
    tls) echo "--tls_ca_file=$certs/ca.pem" ;;
    tls+snappy) echo "--tls_ca_file=$certs/ca.pem --compression=snappy" ;;
  esac
}
# run MODE N: fills topic tN, reads it with MODE; prints "rate client_us_per_msg nsqd_us_per_msg".
run() {
  local mode=$1 n=$2 td cd out n0 n1 msgs rate cpu
  post "topic/create?topic=t$n"
  post "channel/create?topic=t$n&channel=bus"
  $ours --mode=write --nsqd=$addr --topic=t$n --size=200 --batch_size=200 --count=$fill --runfor=120s >/dev/null
  for _ in $(seq 600); do
    read -r td cd < <(depth t$n)
    [[ $td == 0 ]] && break
    sleep 0.1
  done
  n0=$(ticks $nsqd_pid)
  # shellcheck disable=SC2046
  out=$(/usr/bin/time -f 'cpu %U %S' $ours --mode=read --nsqd=$addr --topic=t$n --runfor=$runfor $(flags_of $mode) 2>&1)
  n1=$(ticks $nsqd_pid)
  read -r td cd < <(depth t$n)
  if [[ $cd == 0 ]]; then
    echo "$mode emptied its topic: use a bigger fill" >&2
    exit 1
  fi
  post "topic/delete?topic=t$n"
  python3 - "$out" "$n0" "$n1" "$hz" <<'PY'
import re, sys
out, n0, n1, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
rate = float(re.search(r"ops/s: *([0-9.]+)", out).group(1))
msgs = int(re.search(r"messages: *([0-9]+)", out).group(1))
user, system = map(float, re.findall(r"cpu ([0-9.]+) ([0-9.]+)", out)[-1])
print(round(rate), round((user + system) / msgs * 1e6, 2), round((n1 - n0) / hz / msgs * 1e6, 2))
PY
}
modes=(plain snappy deflate tls tls+snappy)
declare -A r1 r2
n=0
for m in "${modes[@]}"; do n=$((n + 1)); r1[$m]=$(run "$m" $n); done
for ((i = ${#modes[@]} - 1; i >= 0; i--)); do m=${modes[$i]}; n=$((n + 1)); r2[$m]=$(run "$m" $n); done
read -r plain_rate _ _ < <(python3 -c "a='${r1[plain]}'.split(); b='${r2[plain]}'.split(); print((float(a[0])+float(b[0]))/2)")
printf '%-11s %10s %8s %14s %12s  %s\n' mode msgs/s vs-plain client-us/msg nsqd-us/msg runs
for m in "${modes[@]}"; do
  python3 - "$m" "${r1[$m]}" "${r2[$m]}" "$plain_rate" <<'PY'
import sys
m, a, b, plain = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), float(sys.argv[4])
rate = (float(a[0]) + float(b[0])) / 2
cl = (float(a[1]) + float(b[1])) / 2
nq = (float(a[2]) + float(b[2])) / 2
print(f"{m:11s} {rate:10.0f} {rate / plain:8.3f} {cl:14.2f} {nq:12.2f}  ({a[0]}, {b[0]})")
PY
done
