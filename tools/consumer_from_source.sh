#!/usr/bin/env bash
# Builds and tests examples/consumer_from_source: a workspace that declares @com_google_absl and
# @com_google_googletest itself, as Abseil and GoogleTest built from source with their own Bazel
# files (Debian's source packages of the installed libabsl-dev and googletest, unpacked by
# tools/apt_source.sh), and the library against them (docs/packaging.md). Then checks that the
# system Abseil and GoogleTest took no part: no header from /usr/include/{absl,gtest,gmock} in
# any compile's dependency file, no -labsl_*/-lgtest/-lgmock on the test's link line, no
# libabsl_* in its ldd.
# Copies the gtest reports to $1/from_source (default /tmp/consumer-logs).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=${1:-/tmp/consumer-logs}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Abseil's Bazel files load @bazel_skylib: Debian's bazel-skylib package.
bash "$root/tools/apt_install.sh" consumer_from_source bazel-skylib

absl_version=$(dpkg-query -W -f='${Version}' libabsl-dev)
gtest_version=$(dpkg-query -W -f='${Version}' googletest)
bash "$root/tools/apt_source.sh" "$work/src" "abseil=$absl_version" "googletest=$gtest_version"
absl_src=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name 'abseil-*')
gtest_src=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name 'googletest-*')

ws="$work/from_source"
cp -r "$root/examples/consumer_from_source" "$ws"
sed -i -e "s|path = \"../..\"|path = \"$root\"|" -e "s|ABSEIL_SOURCE|$absl_src|" \
  -e "s|GOOGLETEST_SOURCE|$gtest_src|" "$ws/WORKSPACE"
for p in "$root" "$absl_src" "$gtest_src"; do
  grep -q "path = \"$p\"" "$ws/WORKSPACE" || {
    echo "consumer_from_source: the example's WORKSPACE has no path to replace with $p" >&2
    exit 1
  }
done

(cd "$ws" && bazel test //... --disk_cache="$work/cache")
mkdir -p "$out/from_source"
cp -rL "$ws/bazel-testlogs/." "$out/from_source/"

status=0
system_headers=$(find -L "$ws/bazel-out/" -name '*.d' -path '*/_objs/*' -print0 |
  xargs -0 grep -lE '/usr/include/(absl|gtest|gmock)/' || true)
if [ -n "$system_headers" ]; then
  echo "consumer_from_source: these compiles read a system Abseil or GoogleTest header:" >&2
  echo "$system_headers" >&2
  status=1
fi
n_objs=$(find -L "$ws/bazel-out/" -name '*.d' -path '*/_objs/*' | wc -l)
params=$(find -L "$ws/bazel-bin/" -maxdepth 1 -name 'from_source_test*.params')
if [ -z "$params" ] || grep -qE '^-l(absl_|gtest|gmock)' $params; then
  echo "consumer_from_source: the test's link line ($params) names a system library:" >&2
  grep -E '^-l' $params >&2 || true
  status=1
fi
if ldd "$ws/bazel-bin/from_source_test" | grep -E '^\s*lib(absl_|gtest|gmock)'; then
  echo "consumer_from_source: the test loads a system Abseil or GoogleTest" >&2
  status=1
fi
(cd "$ws" && bazel shutdown)
[ "$status" -eq 0 ] && echo "consumer_from_source: ok (no system Abseil or GoogleTest in $n_objs dependency files, the link line, ldd)"
exit "$status"
