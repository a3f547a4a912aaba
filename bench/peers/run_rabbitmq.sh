#!/usr/bin/env bash
# RabbitMQ side by side on one broker (docs/benchmarks/rabbitmq.md): the RabbitMQ driver
# (bench/rabbitmq_bench.cc: confirmed sends, single and batched; end to end through a Handler at
# the HandlerOptions defaults and batched) and the Go peers (bench/peers/rabbitmq, a module of
# its own: a raw amqp091-go publisher with confirms and consumer with manual acks, and
# Watermill's AMQP subscriber), each with this process's CPU and the broker's per message. One
# broker (Debian's rabbitmq-server, started here as a process in a temporary directory, as the
# tests do), quorum queues unless QUEUE_TYPE=classic. Not part of CI.
#   bash bench/peers/run_rabbitmq.sh            # N=20000 messages per step
#   OURS=path/to/rabbitmq_bench bash bench/peers/run_rabbitmq.sh   # an opt build made already
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-20000}
QUEUE_TYPE=${QUEUE_TYPE:-quorum}
# The peers' prefetch: our default in flight (8 workers x 64, HandlerOptions defaults).
PREFETCH=${PREFETCH:-512}
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
if [ -z "${OURS:-}" ]; then
  bazel build -c opt //bench:rabbitmq_bench >&2
  OURS=$(bazel info -c opt bazel-bin)/bench/rabbitmq_bench
fi
ours=$OURS
peer=$(mktemp -d)/rabbitmq_peer
(cd bench/peers/rabbitmq && GOFLAGS=-mod=readonly go build -trimpath -o "$peer" .)

work=$(mktemp -d)
pick_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
amqp=$(pick_port)
dist=$(pick_port)
epmd_port=$(pick_port)
printf 'listeners.tcp.default = 127.0.0.1:%s\nloopback_users = none\nlog.console = false\n' \
  "$amqp" >"$work/rabbitmq.conf"
echo '[].' >"$work/enabled_plugins"
broker_env=(HOME="$work" RABBITMQ_MNESIA_BASE="$work/mnesia" RABBITMQ_LOG_BASE="$work/log"
  RABBITMQ_CONFIG_FILE="$work/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$work/enabled_plugins"
  RABBITMQ_NODENAME="bench-$amqp@localhost" RABBITMQ_DIST_PORT="$dist" ERL_EPMD_PORT="$epmd_port"
  RABBITMQ_ALLOW_INPUT=1 RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-noinput)
epmd -port "$epmd_port" &
epmd_pid=$!
env "${broker_env[@]}" /usr/lib/rabbitmq/bin/rabbitmq-server >"$work/server.log" 2>&1 &
broker=$!
trap 'kill -9 $broker $epmd_pid 2>/dev/null || true; rm -rf "$work" "$(dirname "$peer")"' EXIT
for _ in $(seq 1 240); do
  (echo >"/dev/tcp/127.0.0.1/$amqp") 2>/dev/null && break
  sleep 0.5
done
echo "broker: rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server), pid $broker, port $amqp, $QUEUE_TYPE queues"
common=(--port="$amqp" --broker_pid="$broker" --queue_type="$QUEUE_TYPE")
uri="amqp://guest:guest@127.0.0.1:$amqp/"
"$ours" "${common[@]}" --steps=send,send_batch --messages="$N"
"$peer" -uri="$uri" -mode=raw_send -messages="$N" -broker_pid="$broker" -queue_type="$QUEUE_TYPE"
"$ours" "${common[@]}" --steps=e2e --e2e_messages="$N"
"$ours" "${common[@]}" --steps=e2e --e2e_messages="$N" --handler_batch_size=64 --max_in_flight=512
"$peer" -uri="$uri" -mode=raw_consume -messages="$N" -prefetch="$PREFETCH" -broker_pid="$broker" \
  -queue_type="$QUEUE_TYPE"
"$peer" -uri="$uri" -mode=watermill_e2e -messages="$N" -prefetch="$PREFETCH" -broker_pid="$broker" \
  -queue_type="$QUEUE_TYPE"
