#!/usr/bin/env bash
# The Kafka driver against Kafka's ProducerPerformance and Watermill's Kafka Pub/Sub, in one run
# on one broker that bench/kafka_bench starts (docs/benchmarks/kafka.md):
#   bash bench/peers/run_kafka.sh [--messages=200000] [other kafka_bench flags]
# Needs tools/setup_kafka.sh (Java 17 and the Kafka jars) and Go (the Watermill peer is a module of
# its own, bench/peers/kafka, built here).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
peer=$(mktemp -d)
trap 'rm -rf "$peer"' EXIT
(cd bench/peers/kafka && GOFLAGS=-mod=mod GOTOOLCHAIN=local go build -o "$peer/watermill_kafka" .)
bazel build -c opt //bench:kafka_bench
bazel-bin/bench/kafka_bench --watermill="$peer/watermill_kafka" "$@"
