#!/usr/bin/env bash
# Runs our PostgreSQL driver (bench/postgres_bench.cc) and River (bench/peers/river_bench)
# interleaved against one PostgreSQL 15 started here, for R rounds, then pgbench with the
# driver's reserve statement as the server's limit, and prints a table: what, peer, ours,
# ratio (medians over the rounds, each round's ratio in brackets). Method and figures:
# docs/benchmarks/postgres.md.
#
#   bash bench/peers/run_postgres.sh [--rounds=3] [--e2e_msgs=20000] [--send_msgs=20000]
#                                    [--batch_msgs=100000] [--batch=500] [--pgbench_seconds=10]
#                                    [--profile]
#
# The server: /usr/lib/postgresql/15/bin (tools/setup_tests.sh), a data directory under /tmp owned by
# the `postgres` user (the server refuses root), TCP on a free loopback port, trust auth, fsync
# off (as tests/testing/postgres_server.h), pg_stat_statements loaded. Each round holds flock on
# $BENCH_LOCK (default /tmp/bench.lock); builds happen before, outside the lock. Odd rounds run
# each peer before its counterpart of ours, even rounds after. --profile then runs each side's
# end-to-end once more and prints its statements from pg_stat_statements (calls per message).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 e2e_msgs=20000 send_msgs=20000 batch_msgs=100000 batch=500 pgbench_seconds=10 profile=""
for arg in "$@"; do
  case $arg in
    --rounds=*) rounds=${arg#*=} ;;
    --e2e_msgs=*) e2e_msgs=${arg#*=} ;;
    --send_msgs=*) send_msgs=${arg#*=} ;;
    --batch_msgs=*) batch_msgs=${arg#*=} ;;
    --batch=*) batch=${arg#*=} ;;
    --pgbench_seconds=*) pgbench_seconds=${arg#*=} ;;
    --profile) profile=1 ;;
    *) echo "usage: see the head of $0" >&2; exit 2 ;;
  esac
done
lock=${BENCH_LOCK:-/tmp/bench.lock}
pgbin=/usr/lib/postgresql/15/bin

# ---- Build (outside the lock) ----
bazel build -c opt --jobs=2 //bench:postgres_bench >/dev/null 2>&1 ||
  { echo "run_postgres.sh: bazel build failed" >&2; exit 1; }
ours=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/postgres_bench
peers=$(bash bench/peers/build.sh | tail -1)

# ---- PostgreSQL 15 ----
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d /tmp/bus-bench-pg-XXXXXX)
as_pg=()
if [[ $(id -u) == 0 ]]; then
  chown postgres: "$data"
  as_pg=(setpriv --reuid=postgres --regid=postgres --clear-groups --)
fi
"${as_pg[@]}" "$pgbin/initdb" -D "$data/db" -U bus_bench --auth=trust --encoding=UTF8 \
  --no-locale --no-sync >"$data/initdb.log" 2>&1 ||
  { cat "$data/initdb.log" >&2; exit 1; }
"${as_pg[@]}" "$pgbin/postgres" -D "$data/db" -p "$port" -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories= -c fsync=off -c shared_preload_libraries=pg_stat_statements \
  >"$data/postgres.log" 2>&1 &
pg_pid=$!
trap 'kill -INT $pg_pid 2>/dev/null; wait $pg_pid 2>/dev/null; rm -rf "$data"' EXIT
url="postgres://bus_bench@127.0.0.1:$port/postgres"
for _ in $(seq 300); do "$pgbin/pg_isready" -q -d "$url" && break; sleep 0.1; done
psql() { command psql -X -q -v ON_ERROR_STOP=1 -At -d "$url" "$@"; }
psql -c "CREATE EXTENSION pg_stat_statements"
echo "$(psql -c 'SHOW server_version') on 127.0.0.1:$port; $rounds rounds; messages: e2e" \
  "$e2e_msgs, sends $send_msgs, batches $batch_msgs ($batch a call)"

# The limit's queue: 100,000 ready rows that pgbench's reserve cycles through.
"$ours" --postgres_url="$url" --mode=fill --schema=pgbench_reserve --queue=pgbench \
  --messages=100000 >/dev/null

# ---- The runs: name -> command printing a line with rate=R ----
rate_of() { grep -o 'rate=[0-9.]*' | tail -1 | cut -d= -f2; }
run() {
  local name=$1 r
  case $name in
    river_e2e) r=$("$peers/river_bench" -url "$url" -mode e2e -msgs "$e2e_msgs" | rate_of) ;;
    river_e2e_1ms)
      r=$("$peers/river_bench" -url "$url" -mode e2e -msgs "$e2e_msgs" -fetch_cooldown 1ms |
        rate_of) ;;
    river_send) r=$("$peers/river_bench" -url "$url" -mode send -msgs "$send_msgs" | rate_of) ;;
    river_batch)
      r=$("$peers/river_bench" -url "$url" -mode batch -batch "$batch" -msgs "$batch_msgs" | rate_of) ;;
    ours_e2e) r=$("$ours" --postgres_url="$url" --mode=e2e --messages="$e2e_msgs" | rate_of) ;;
    ours_e2e_c1)
      r=$("$ours" --postgres_url="$url" --mode=e2e --concurrency=1 --messages="$e2e_msgs" |
        rate_of) ;;
    ours_send) r=$("$ours" --postgres_url="$url" --mode=send --messages="$send_msgs" | rate_of) ;;
    ours_batch)
      r=$("$ours" --postgres_url="$url" --mode=batch --batch="$batch" --messages="$batch_msgs" |
        rate_of) ;;
    pgbench_reserve)
      psql -c "VACUUM pgbench_reserve.queue_messages"
      local tps
      tps=$("$pgbin/pgbench" -n -M prepared -f bench/postgres_reserve.sql -D batch=256 -c 8 -j 8 \
        -T "$pgbench_seconds" "$url" 2>&1 | grep -o 'tps = [0-9.]*' | tail -1 | cut -d' ' -f3)
      r=$(python3 -c "print(round($tps * 256))") ;;
    *) echo "unknown run $name" >&2; exit 1 ;;
  esac
  r=${r%.*}
  [[ -n $r && $r -gt 0 ]] || { echo "run $name gave no rate" >&2; exit 1; }
  echo "$r"
}

# Rows: what | peer run | ours run | peer label.
rows=(
  "End to end: sent first, then taken by a no-op handler (ours: concurrency 8, the PostgreSQL idempotency store on; River: MaxWorkers 100)|river_e2e|ours_e2e|River v0.51.2 InsertMany, then Client"
  "End to end, ours at every HandlerOptions default (concurrency 1)|river_e2e|ours_e2e_c1|River v0.51.2 InsertMany, then Client"
  "End to end, ours at concurrency 8; River's FetchCooldown 1 ms (its default 100 ms caps a queue at MaxWorkers per 100 ms)|river_e2e_1ms|ours_e2e|River v0.51.2, FetchCooldown 1 ms"
  "Sends, one message per call, 8 threads|river_send|ours_send|River v0.51.2 Client.Insert x 8 goroutines"
  "Sends, $batch messages per call, 8 threads|river_batch|ours_batch|River v0.51.2 Client.InsertMany x 8 goroutines"
  "End to end against the server's reserve limit|pgbench_reserve|ours_e2e|pgbench -c 8, the driver's reserve of 256 rows, x 256"
)
results=$(mktemp)
for r in $(seq "$rounds"); do
  exec 9>"$lock"
  flock 9
  echo "== round $r ($( ((r % 2)) && echo peers-first || echo ours-first), load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M:%S) UTC)"
  declare -A got=()
  for row in "${rows[@]}"; do
    IFS='|' read -r _ peer mine _ <<<"$row"
    if ((r % 2)); then order=("$peer" "$mine"); else order=("$mine" "$peer"); fi
    for name in "${order[@]}"; do
      [[ -n ${got[$name]:-} ]] && continue
      got[$name]=$(run "$name")
      printf '  %-16s %10s msg/s\n' "$name" "${got[$name]}"
      echo "$r $name ${got[$name]}" >>"$results"
    done
  done
  flock -u 9
  unset got
done

echo
echo "| what | peer | peer msg/s | ours msg/s | ratio |"
echo "|---|---|---|---|---|"
ROWS=$(printf '%s\n' "${rows[@]}") python3 - "$results" <<'PY'
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
PY
echo "(medians of $rounds rounds; ratio = median of the per-round ratios ours/peer, each round's in brackets)"
rm -f "$results"

# ---- Where the time goes: each side's end to end once more, its statements counted ----
if [[ -n $profile ]]; then
  exec 9>"$lock"
  flock 9
  for name in river_e2e ours_e2e; do
    psql -c "SELECT pg_stat_statements_reset()" >/dev/null
    echo
    echo "== $name: $(run "$name") msg/s; statements (calls per message, ms per message):"
    psql -F ' | ' -c "SELECT round(calls::numeric / $e2e_msgs, 3), round((total_exec_time /
        $e2e_msgs)::numeric, 4), left(regexp_replace(query, '\s+', ' ', 'g'), 110)
      FROM pg_stat_statements WHERE calls > 0 AND query NOT LIKE '%pg_stat_statements%'
      ORDER BY total_exec_time DESC LIMIT 12"
    psql -F ' | ' -c "SELECT 'all', round(sum(calls)::numeric / $e2e_msgs, 3),
        round((sum(total_exec_time) / $e2e_msgs)::numeric, 4) FROM pg_stat_statements
      WHERE query NOT LIKE '%pg_stat_statements%'"
  done
  flock -u 9
fi
