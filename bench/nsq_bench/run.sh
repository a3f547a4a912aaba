#!/usr/bin/env bash
# Runs nsq's bench_writer/bench_reader and the driver's nsq_bench side by side against one
# nsqd on a free loopback port, and prints each rate and our/their ratio.
#   bash bench/nsq_bench/run.sh [runfor=10s] [rounds=4] [publish_rounds=8]
#
# Publish: after a discarded warm-up of each writer, `publish_rounds` rounds; each runs both
# sides twice for runfor/4 each, in the order theirs, ours, ours, theirs (odd rounds) or ours,
# theirs, theirs, ours (even rounds), each run into a fresh topic (nothing reads it) that is
# deleted after the run, so no run pays for an earlier run's messages in nsqd's
# heap more than the other side. A round's ratio is the mean of our two runs over the mean of
# theirs; the script prints every run (rate, and the CPU per message of nsqd, from /proc, and
# of the writer process, from /usr/bin/time), every round's ratio, and the median and min-max
# of the rounds' ratios. Each writer stops its clock at nsqd's reply to its last MPUB. Both
# sides publish into a topic with one channel: our driver creates channel `bus` of a queue's
# topic before its first publish (so nsqd keeps the messages for the queue's consumers), and
# the script creates the same for bench_writer's topic (a topic without a channel costs nsqd
# about 30 % less CPU per message: it keeps the messages without copying them to a channel).
#
# Consume: `rounds` rounds. Each round fills one fresh topic that has two channels, `ch`
# (theirs) and `bus` (ours), with (1 + runfor/2) million messages from our writer, so both
# readers face the same backlog (the same messages, byte for byte: 204-byte bodies); waits
# until nsqd has copied every message into both channels; lets each reader warm up for 1s
# (discarded); then reads runfor/4 per run in the order theirs, ours, ours, theirs (odd
# rounds) or ours, theirs, theirs, ours (even rounds). A side's rate is the mean of all its
# runs; every run is printed. A run that emptied its channel would understate that side, so
# the script fails if a channel is empty after a round.
set -euo pipefail
cd "$(dirname "$0")/../.."
runfor=${1:-10s}
rounds=${2:-4}
publish_rounds=${3:-8}
secs=${runfor%s}
half=$(python3 -c "print(str($secs/2)+'s')")
quarter=$(python3 -c "print(str($secs/4)+'s')")
# Messages per consume round: enough for 1s + runfor/2 of reading at well over 600k msgs/s,
# and below --mem-queue-size so every message stays in nsqd's memory.
fill_count=$(python3 -c "print(int((1 + $secs / 2) * 1000000))")
source bench/nsq_bench/nsqd.sh
start_nsqd
rate() { grep -o 'ops/s: *[0-9.]*\|[0-9.]*ops/s' | grep -o '[0-9.]*' | head -1 | cut -d. -f1; }
mean() { python3 -c "import sys; v=[float(x) for x in sys.argv[1:]]; print(round(sum(v)/len(v)))" "$@"; }
ratio() { python3 -c "print(round($1/$2,3))"; }
post() { curl -sf -X POST "$http/$1" >/dev/null; }
# Depths of topic $1 as "topic_depth ch_depth bus_depth" (in-memory plus on-disk).
depths() {
  curl -sf "$http/stats?format=json&topic=$1" | python3 -c '
import json, sys
t = json.load(sys.stdin)["topics"][0]
c = {x["channel_name"]: x["depth"] + x["backend_depth"] for x in t["channels"]}
print(t["depth"] + t["backend_depth"], c.get("ch", 0), c.get("bus", 0))'
}

# ---- Publish ----
hz=$(getconf CLK_TCK)
nsqd_ticks() { awk '{print $14 + $15}' "/proc/$nsqd_pid/stat"; }
# write SIDE TOPIC: "rate nsqd_us_per_msg client_us_per_msg" of one run of runfor/4.
write() {
  local side=$1 topic=$2 n0 t0 out t1 n1
  n0=$(nsqd_ticks)
  t0=$(date +%s.%N)
  if [[ $side == theirs ]]; then
    # The channel our driver makes for a queue before its first publish (NsqOptions
    # queue_channel, "bus"): nsqd then copies every message into it, for both sides.
    post "topic/create?topic=$topic"
    post "channel/create?topic=$topic&channel=bus"
    out=$(/usr/bin/time -f 'cpu %U %S' nsq_bench_writer --nsqd-tcp-address=$addr --topic=$topic \
      --size=200 --batch-size=200 --runfor=$quarter 2>&1)
  else
    out=$(/usr/bin/time -f 'cpu %U %S' $ours --mode=write --nsqd=$addr --topic=$topic --size=200 \
      --batch_size=200 --runfor=$quarter 2>&1)
  fi
  t1=$(date +%s.%N)
  n1=$(nsqd_ticks)
  post "topic/delete?topic=$topic"
  python3 - "$(rate <<<"$out")" "$t0" "$t1" "$n0" "$n1" "$hz" $(grep -o 'cpu [0-9.]* [0-9.]*' <<<"$out" | tail -1) <<'PY'
import sys
rate, t0, t1, n0, n1, hz, _, user, sys_ = sys.argv[1:]
msgs = float(rate) * (float(t1) - float(t0))
print(rate, f"{(float(n1) - float(n0)) / float(hz) * 1e6 / msgs:.2f}",
      f"{(float(user) + float(sys_)) * 1e6 / msgs:.2f}")
PY
}
# Warm-up (discarded): nsqd's first seconds are unlike the rest.
nsq_bench_writer --nsqd-tcp-address=$addr --topic=warmup --size=200 --batch-size=200 --runfor=2s >/dev/null 2>&1
$ours --mode=write --nsqd=$addr --topic=warmup2 --size=200 --batch_size=200 --runfor=2s >/dev/null
for t in warmup warmup2; do post "topic/delete?topic=$t"; done
pub_ratios=()
pub_theirs=()
pub_ours=()
for r in $(seq "$publish_rounds"); do
  if ((r % 2)); then order=(theirs ours ours theirs); else order=(ours theirs theirs ours); fi
  declare -A runs=([theirs]="" [ours]="")
  line=""
  for i in 0 1 2 3; do
    side=${order[$i]}
    read -r w nu cu < <(write "$side" "p$r-$i")
    runs[$side]+=" $w"
    line+=" $side=$w (nsqd ${nu} us/msg, writer ${cu} us/msg)"
  done
  tm=$(mean ${runs[theirs]}); om=$(mean ${runs[ours]})
  pub_theirs+=(${runs[theirs]}); pub_ours+=(${runs[ours]})
  pub_ratios+=("$(ratio $om $tm)")
  echo "publish round $r:$line ratio=$(ratio $om $tm)"
  unset runs
done
python3 - "${pub_ratios[*]}" "${pub_theirs[*]}" "${pub_ours[*]}" <<'PY'
import statistics, sys
ratios, theirs, ours = ([float(x) for x in a.split()] for a in sys.argv[1:])
print(f"publish  msgs/s: bench_writer={statistics.median(theirs):,.0f} ours={statistics.median(ours):,.0f}"
      f" (medians of {len(theirs)} runs each) ratio: median {statistics.median(ratios):.3f},"
      f" min {min(ratios):.3f}, max {max(ratios):.3f} ({len(ratios)} rounds)")
PY

# ---- Consume ----
their_read_for() { nsq_bench_reader --nsqd-tcp-address=$addr --topic=c$2 --channel=ch --size=200 --runfor=$1 2>&1 | rate; }
our_read_for() { $ours --mode=read --nsqd=$addr --topic=c$2 --runfor=$1 | rate; }
their_read() { their_read_for $quarter $1; }
our_read() { our_read_for $quarter $1; }
theirs_all=()
ours_all=()
for r in $(seq "$rounds"); do
  post "topic/create?topic=c$r"
  post "channel/create?topic=c$r&channel=ch"
  post "channel/create?topic=c$r&channel=bus"
  $ours --mode=write --nsqd=$addr --topic=c$r --size=200 --batch_size=200 --count=$fill_count --runfor=120s >/dev/null
  for _ in $(seq 600); do
    read -r td cd bd < <(depths c$r)
    [[ $td == 0 && $cd == "$bd" ]] && break
    sleep 0.1
  done
  fill=$bd
  # Discarded warm-up reads (1s each, in the round's order): the first read after a fill pays
  # for nsqd's garbage collection of the fill.
  if ((r % 2)); then their_read_for 1s $r >/dev/null; our_read_for 1s $r >/dev/null
  else our_read_for 1s $r >/dev/null; their_read_for 1s $r >/dev/null; fi
  if ((r % 2)); then
    t1=$(their_read $r); o1=$(our_read $r); o2=$(our_read $r); t2=$(their_read $r)
  else
    o1=$(our_read $r); t1=$(their_read $r); t2=$(their_read $r); o2=$(our_read $r)
  fi
  read -r td cd bd < <(depths c$r)
  echo "consume round $r ($( ((r % 2)) && echo theirs-first || echo ours-first), backlog $fill each, left ch=$cd bus=$bd): bench_reader $t1 $t2 ours $o1 $o2 ratio=$(ratio "$(mean $o1 $o2)" "$(mean $t1 $t2)")"
  if [[ $cd == 0 || $bd == 0 ]]; then
    echo "a channel ran empty in round $r: use a longer runfor (bigger backlog)" >&2
    exit 1
  fi
  theirs_all+=("$t1" "$t2")
  ours_all+=("$o1" "$o2")
  post "topic/delete?topic=c$r"
done
tr=$(mean "${theirs_all[@]}"); or=$(mean "${ours_all[@]}")
echo "consume  msgs/s: bench_reader=$tr ours=$or ratio=$(ratio $or $tr) ($rounds rounds, $((2 * rounds)) runs each)"
