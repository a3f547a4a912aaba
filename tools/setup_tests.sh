#!/usr/bin/env bash
# Installs everything the tests, the CI checks and the benchmarks need on Debian 12, after what
# the build needs (tools/setup.sh, run first): the servers the tests start (redis-server and
# redis-sentinel, PostgreSQL 15, run as the unprivileged `postgres` user the package creates),
# nsqd/nsqlookupd plus nsq's bench_writer/bench_reader built from the Go module
# github.com/nsqio/nsq v1.3.0, Jaeger v2 (the OTLP collector of observability/otlp:jaeger_test)
# built from github.com/jaegertracing/jaeger v1.76.0, a Python venv with the official Prometheus
# client (its text-format parser checks /metrics in the admin tests), chromium (headless, for the
# web console's browser tests, docs/console.md), CMake, Ninja and pkg-config (tools/cmake_check.sh),
# clang-format, curl and openssl (test certificates are made at run time).
# Idempotent: returns in a few seconds when everything is present.
set -euo pipefail
here=$(dirname "$0")
bash "$here/setup.sh"

packages=(
  cmake ninja-build pkg-config clang-format sqlite3 openssl curl python3-venv chromium
  redis-server redis-tools redis-sentinel postgresql-15 postgresql-client-15 golang-go
)
nsq_version=v1.3.0
nsq_bin=/usr/local/bin
jaeger_version=v1.76.0
# The admin tests run $prom_venv/bin/python3 (tests/testing/http.h).
prom_venv=/usr/local/lib/bus-prometheus-venv
prom_client_version=0.26.0

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

# A Go toolchain already on PATH (newer than Debian's) serves as well.
[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
if command -v go >/dev/null 2>&1; then
  packages=($(printf '%s\n' "${packages[@]}" | grep -vx golang-go))
fi
bash "$here/apt_install.sh" setup_tests "${packages[@]}"

# redis-server from Debian starts a system service on install; the tests start their own
# servers on free ports, so the system one is not needed.
# redis-sentinel's package starts one too.
for service in redis-server redis-sentinel; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$service" 2>/dev/null; then
    "${sudo_cmd[@]}" systemctl stop "$service" || true
  fi
done

# postgresql-15 creates and starts a cluster of its own (15/main on port 5432); the tests run
# /usr/lib/postgresql/15/bin/postgres in temporary directories on free ports
# (tests/testing/postgres_server.h), so the system one is stopped.
if command -v pg_ctlcluster >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | grep -q online; then
  pg_lsclusters -h | awk '$4 == "online" {print $1, $2}' | while read -r version cluster; do
    "${sudo_cmd[@]}" pg_ctlcluster "$version" "$cluster" stop || true
  done
fi
# The tests run the server as `postgres` (it refuses to run as root); the package creates the
# user, this makes sure it exists where the package was installed without it.
if ! id -u postgres >/dev/null 2>&1; then
  "${sudo_cmd[@]}" useradd --system --user-group --home-dir /var/lib/postgresql \
    --shell /bin/bash postgres
fi

have_nsq() {
  for b in nsqd nsqlookupd nsq_bench_writer nsq_bench_reader; do
    [ -x "$nsq_bin/$b" ] || return 1
  done
  "$nsq_bin/nsqd" --version 2>/dev/null | grep -q "${nsq_version#v}"
}
if ! have_nsq; then
  echo "setup: building nsqd, nsqlookupd, bench_writer and bench_reader ${nsq_version}"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # nsq's own go.mod replaces github.com/judwhite/go-svc, and `go install pkg@version` refuses
  # modules with a replace, so a throwaway module requires nsq and repeats that replace.
  cat >"$work/go.mod" <<MOD
module msgbus.local/nsqtools

go 1.17

require github.com/nsqio/nsq ${nsq_version}

replace github.com/judwhite/go-svc => github.com/mreiferson/go-svc v1.2.2-0.20210815184239-7a96e00010f6
MOD
  (
    cd "$work"
    export GOFLAGS=-mod=mod GOTOOLCHAIN=local
    go get github.com/nsqio/nsq@${nsq_version} >/dev/null 2>&1
    mkdir -p bin
    go build -o bin/ github.com/nsqio/nsq/apps/nsqd github.com/nsqio/nsq/apps/nsqlookupd \
      github.com/nsqio/nsq/bench/bench_writer github.com/nsqio/nsq/bench/bench_reader
  )
  "${sudo_cmd[@]}" install -m 0755 "$work/bin/nsqd" "$work/bin/nsqlookupd" "$nsq_bin/"
  "${sudo_cmd[@]}" install -m 0755 "$work/bin/bench_writer" "$nsq_bin/nsq_bench_writer"
  "${sudo_cmd[@]}" install -m 0755 "$work/bin/bench_reader" "$nsq_bin/nsq_bench_reader"
fi
# Jaeger v2 (cmd/jaeger). Its go.mod has a replace, which `go install pkg@version` refuses, so a
# throwaway module requires it and repeats the replace, as for nsq above. Download and build took
# 18 minutes here (cold module cache, 2 cores shared with other builds, `go build -p 1`).
have_jaeger() {
  [ -x "$nsq_bin/jaeger" ] &&
    go version -m "$nsq_bin/jaeger" 2>/dev/null | grep -q "github.com/jaegertracing/jaeger[[:space:]]*${jaeger_version}"
}
if ! have_jaeger; then
  echo "setup: building jaeger ${jaeger_version}"
  jaeger_work=$(mktemp -d)
  cat >"$jaeger_work/go.mod" <<MOD
module msgbus.local/jaegertool

go 1.24.6

require github.com/jaegertracing/jaeger ${jaeger_version}

replace github.com/Shopify/sarama => github.com/Shopify/sarama v1.33.0
MOD
  (
    cd "$jaeger_work"
    export GOFLAGS=-mod=mod GOTOOLCHAIN=local
    go get github.com/jaegertracing/jaeger@${jaeger_version} >/dev/null 2>&1
    go build -o jaeger github.com/jaegertracing/jaeger/cmd/jaeger
  )
  "${sudo_cmd[@]}" install -m 0755 "$jaeger_work/jaeger" "$nsq_bin/jaeger"
  rm -rf "$jaeger_work"
fi
# promtool built from the Go module of Prometheus took 9 minutes here (cold module cache, 2
# cores), the official Python client's parser 9 seconds: the tests use the latter.
if ! "$prom_venv/bin/python3" -c "import importlib.metadata as m, sys; \
    sys.exit(m.version('prometheus_client') != '$prom_client_version')" 2>/dev/null; then
  echo "setup: installing prometheus_client $prom_client_version into $prom_venv"
  "${sudo_cmd[@]}" python3 -m venv "$prom_venv"
  "${sudo_cmd[@]}" "$prom_venv/bin/pip" install -q "prometheus_client==$prom_client_version"
fi
# The brokers of the newer drivers, one script each.
bash "$here/setup_nats.sh"
bash "$here/setup_rabbitmq.sh"
bash "$here/setup_kafka.sh"
echo "setup_tests: ok"
