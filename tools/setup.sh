#!/usr/bin/env bash
# Installs what building the library and running the quickstart need on Debian 12, all from
# Debian's packages: the compiler, Bazel (bazel-bootstrap, offline) and the system libraries
# every target links (Abseil, Boost, hiredis, SQLite, nlohmann/json, GoogleTest, Google
# Benchmark, libpq, OpenSSL, snappy, zlib, rabbitmq-c, librdkafka, cnats). No server and no Go
# build: tools/setup_tests.sh adds what the tests start (it runs this script first).
# Idempotent: returns in about a second when everything is present.
set -euo pipefail

packages=(
  bazel-bootstrap bazel-platforms g++
  libabsl-dev libboost-dev libboost-system-dev libhiredis-dev libsqlite3-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  libpq-dev libssl-dev libsnappy-dev zlib1g-dev
  librabbitmq-dev librdkafka-dev libnats-dev
)
bash "$(dirname "$0")/apt_install.sh" setup "${packages[@]}"
echo "setup: ok"
