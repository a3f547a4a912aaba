#!/usr/bin/env bash
# Builds and tests examples/consumer (a workspace that depends on this library) from a clean
# state, with the steps of README.md's "Using it from another Bazel workspace", twice: with the
# library as a local_repository (the README's WORKSPACE lines, read from README.md), and as an http_archive of a
# `git archive` tarball of HEAD (file:// URL: no network). Both runs share a disk cache, so the
# second builds little.
# Then builds and tests examples/consumer_from_source, the library over Abseil and GoogleTest
# built from Debian's source packages (tools/consumer_from_source.sh).
# Copies the consumers' gtest reports to $1 (default /tmp/consumer-logs) for counting.
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

# The README's steps, taken from README.md itself (tools/doc_block.py): its WORKSPACE lines
# (with this checkout as the path) and its .bazelrc lines, every one of which the example's
# .bazelrc must hold.
readme_block() { python3 "$root/tools/doc_block.py" "$root/README.md" "$1"; }
readme_workspace=$(readme_block workspace)
readme_bazelrc=$(readme_block bazelrc)
while IFS= read -r line; do
  case "$line" in "" | "#"*) continue ;; esac
  grep -qxF -- "$line" "$root/examples/consumer/.bazelrc" || {
    echo "consumer_check: README.md's .bazelrc line is not in examples/consumer/.bazelrc: $line" >&2
    exit 1
  }
done <<<"$readme_bazelrc"

# 1. local_repository: a copy of the example whose WORKSPACE is the README's, pointing at this
# checkout.
cp -r "$root/examples/consumer" "$work/local"
{
  echo 'workspace(name = "orders_consumer")'
  echo "$readme_workspace" | sed "s|path = \"third_party/msgbus\"|path = \"$root\"|"
} >"$work/local/WORKSPACE"
grep -q "path = \"$root\"" "$work/local/WORKSPACE" || {
  echo "consumer_check: README.md's WORKSPACE block has no local_repository path to replace" >&2
  exit 1
}
# Every target README.md names exists.
labels=$(grep -o '@msgbus//[A-Za-z0-9_/:.-]*' "$root/README.md" | grep -v '\.bzl$' | sort -u)
(cd "$work/local" && for label in $labels; do
  bazel query --disk_cache="$work/cache" "$label" >/dev/null 2>&1 || {
    echo "consumer_check: README.md names $label, which does not exist" >&2
    exit 1
  }
done)
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

# 3. Abseil and GoogleTest from source, declared by the consumer under the library's names.
bash "$root/tools/consumer_from_source.sh" "$out"
echo "consumer_check: ok"
