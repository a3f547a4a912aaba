#!/usr/bin/env bash
# Builds and tests examples/consumer (a workspace that depends on this library) from a clean
# state, with the steps of README.md's "Using it from another Bazel workspace", twice: with the
# library as a local_repository (the example's own WORKSPACE), and as an http_archive of a
# `git archive` tarball of HEAD (file:// URL: no network). Both runs share a disk cache, so the
# second builds little.
# Copies the consumer's gtest reports to $1 (default /tmp/consumer-logs) for counting.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=${1:-/tmp/consumer-logs}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run_consumer() {  # $1: workspace dir, $2: label for the reports
  (cd "$1" && bazel test //... --disk_cache="$work/cache" &&
    bazel run //:orders_service --disk_cache="$work/cache" -- "$work/$2.db")
  mkdir -p "$out/$2"
  cp -rL "$1/bazel-testlogs/." "$out/$2/"
  (cd "$1" && bazel shutdown)
}

# 1. local_repository: a copy of the example, pointing at this checkout.
cp -r "$root/examples/consumer" "$work/local"
sed -i "s|path = \"../..\"|path = \"$root\"|" "$work/local/WORKSPACE"
run_consumer "$work/local" local

# 2. http_archive of `git archive HEAD`, fetched from file://.
git -C "$root" archive --format=tar.gz --prefix=msgbus/ -o "$work/msgbus.tar.gz" HEAD
cp -r "$root/examples/consumer" "$work/archive"
sha=$(sha256sum "$work/msgbus.tar.gz" | cut -d' ' -f1)
cat >"$work/archive/WORKSPACE" <<WS
workspace(name = "orders_consumer")

load("@bazel_tools//tools/build_defs/repo:http.bzl", "http_archive")

http_archive(
    name = "msgbus",
    sha256 = "$sha",
    strip_prefix = "msgbus",
    urls = ["file://$work/msgbus.tar.gz"],
)

load("@msgbus//:repositories.bzl", "msgbus_dependencies")

msgbus_dependencies()
WS
run_consumer "$work/archive" archive
echo "consumer_check: ok"
