#!/usr/bin/env bash
# Checks the CMake build (CMakeLists.txt, docs/cmake.md) the way a user meets it:
#  1. the files CMake builds each library (and busctl) from are the srcs and hdrs of the Bazel ones
#     (bazel query; skipped, saying so, when bazel is not on PATH);
#  2. configures and builds the libraries in a temporary directory, warnings as errors;
#  3. installs them to a temporary prefix (no test or benchmark file in it);
#  4. builds examples/cmake_consumer against the installed package with
#     find_package(msgbus CONFIG), with CMake's pkg-config module (msgbus.pc), and with a plain
#     compiler line from `pkg-config --cflags --libs msgbus`, and runs each build's programs: one
#     publishes and handles one message on the memory driver with SQLite stores and reports
#     bus::Version(), the other is a GoogleTest test on the installed test harness;
#  5. runs docs/cmake.md's consumer blocks and commands as they stand (tools/doc_block.py).
# Prints one line per step; on a failure, the end of that step's log, and exits 1.
#
#   bash tools/cmake_check.sh
#
# Environment: CMAKE_CHECK_JOBS (parallel jobs, default: the number of CPUs), CMAKE_CHECK_KEEP=1
# keeps the temporary directory (printed) for a look at the build or the installed tree.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

jobs=${CMAKE_CHECK_JOBS:-$(nproc)}
work=$(mktemp -d "${TMPDIR:-/tmp}/msgbus-cmake-check.XXXXXX")
if [ "${CMAKE_CHECK_KEEP:-0}" = 1 ]; then
  echo "cmake_check: keeping $work"
else
  trap 'rm -rf "$work"' EXIT
fi
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
prefix=$work/prefix
version=$(head -n 1 VERSION)

# step NAME COMMAND...: runs COMMAND with its output in $work/NAME.log.
step() {
  local name=$1
  shift
  local start=$SECONDS
  if "$@" >"$work/$name.log" 2>&1; then
    echo "cmake_check: $name ok ($((SECONDS - start)) s)"
  else
    echo "cmake_check: $name FAILED; the end of $work/$name.log:"
    tail -n 40 "$work/$name.log"
    trap - EXIT
    exit 1
  fi
}

# 1. The same sources as Bazel: every source file in srcs/hdrs of the non-test cc_library
# targets in the library packages, of the users' test harness and simulator (//testing,
# //testing:simulation) and of busctl, against the list CMake writes at configure time.
compare_with_bazel() {
  local pkgs='//bus/... + //common/... + //drivers/... + //storage/... + //idempotency/...'
  pkgs+=' + //transactional/...'
  pkgs+=' + //url/... + //admin/... + //observability/...'
  local libs="attr(testonly, 0, kind(cc_library, $pkgs)) + //testing"
  libs+=" + //testing:simulation + //busctl"
  bazel query "kind('source file', labels(srcs, $libs) + labels(hdrs, $libs))" --output=label \
    2>"$work/query.err" |
    sed -e 's|^//||' -e 's|:|/|' | sort >"$work/bazel_files.txt" ||
    { cat "$work/query.err"; return 1; }
  [ -s "$work/bazel_files.txt" ] || { echo "bazel query listed no files"; return 1; }
  diff -u --label bazel --label cmake "$work/bazel_files.txt" "$work/build/msgbus_files.txt" ||
    { echo "CMakeLists.txt builds other files than the Bazel libraries (above: - Bazel only," \
      "+ CMake only)"; return 1; }
}

# 3. Nothing from the tests or benchmarks is installed.
check_installed_tree() {
  find "$prefix" -type f | sed "s|^$prefix/||" | sort
  if find "$prefix" -type f \( -name '*_test.*' -o -name '*_bench.*' -o -path '*/tests/*' \) |
    grep .; then
    echo "test or benchmark files installed (above)"
    return 1
  fi
  for h in bus/handler.h testing/harness.h; do
    [ -f "$prefix/include/msgbus/$h" ] || { echo "no include/msgbus/$h"; return 1; }
  done
}

# 4. One consumer build and run.
run_consumer() {
  local dir=$1
  shift
  "$@" || return 1
  "$dir/cmake_consumer" "$dir/consumer.db" | tee "$dir/run.out" || return 1
  grep -q "^msgbus $version: handled " "$dir/run.out" ||
    { echo "the consumer did not report msgbus $version"; return 1; }
  "$dir/harness_test"
}
consumer_find_package() {
  local dir=$work/consumer-find-package
  cmake -S examples/cmake_consumer -B "$dir" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" |
    tee "$dir.configure.log"
  grep -q "msgbus $version from $prefix/" "$dir.configure.log" ||
    { echo "find_package did not find msgbus $version in $prefix"; return 1; }
  run_consumer "$dir" cmake --build "$dir" -j "$jobs"
}
consumer_pkg_config_cmake() {
  local dir=$work/consumer-pkg-config
  PKG_CONFIG_PATH=$pcdir cmake -S examples/cmake_consumer -B "$dir" "${generator[@]}" \
    -DUSE_PKG_CONFIG=ON | tee "$dir.configure.log"
  grep -q "msgbus $version from $prefix" "$dir.configure.log" ||
    { echo "pkg-config did not find msgbus $version in $prefix"; return 1; }
  run_consumer "$dir" cmake --build "$dir" -j "$jobs"
}
consumer_pkg_config_cxx() {
  local dir=$work/consumer-cxx
  mkdir -p "$dir"
  local flags test_flags
  flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs msgbus)
  test_flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs msgbus-testing gtest_main)
  echo "c++ -std=c++20 $flags"
  # shellcheck disable=SC2086  # $flags and $test_flags are lists of flags
  c++ -std=c++20 -Wall -Wextra -Werror -o "$dir/harness_test" \
    examples/cmake_consumer/harness_test.cc $test_flags &&
    run_consumer "$dir" c++ -std=c++20 -Wall -Wextra -Werror -o "$dir/cmake_consumer" \
      examples/cmake_consumer/main.cc $flags
}

# 5. docs/cmake.md's consumer, from the doc itself (tools/doc_block.py): its CMakeLists.txt
# blocks with examples/cmake_consumer/main.cc as main.cc, built with the doc's commands (its
# /opt/msgbus replaced by the prefix), each program run. The pkg-config block is the part a
# user adds to a project of theirs, so it gets the find_package block's first two lines.
docs_consumer() {
  local doc=$root/docs/cmake.md block="python3 $root/tools/doc_block.py $root/docs/cmake.md"
  local fp=$work/docs-find-package pc=$work/docs-pkg-config
  mkdir -p "$fp" "$pc"
  $block cmake-find-package >"$fp/CMakeLists.txt" || return 1
  { $block cmake-find-package | head -n 2 && $block cmake-pkg-config; } >"$pc/CMakeLists.txt" ||
    return 1
  cp examples/cmake_consumer/main.cc "$fp/main.cc"
  cp examples/cmake_consumer/main.cc "$pc/main.cc"
  local commands
  commands=$($block cmake-find-package-build | sed "s|/opt/msgbus|$prefix|g") || return 1
  (cd "$fp" && echo "+ $commands" && bash -euo pipefail -c "$commands") || return 1
  "$fp/build/orders" "$fp/orders.db" | grep "^msgbus $version: handled " || return 1
  commands=$($block cmake-pkg-config-build | sed "s|/opt/msgbus|$prefix|g") || return 1
  (cd "$pc" && echo "+ $commands" && bash -euo pipefail -c "$commands") || return 1
  "$pc/build/orders" "$pc/orders.db" | grep "^msgbus $version: handled " || return 1
  "$pc/a.out" "$pc/a.db" | grep "^msgbus $version: handled " || return 1
  echo "docs/cmake.md's consumer steps ran ($doc)"
}

echo "cmake_check: msgbus $version, $(cmake --version | head -n 1), $jobs jobs, in $work"
step configure cmake -S "$root" -B "$work/build" "${generator[@]}" -DCMAKE_INSTALL_PREFIX="$prefix"
if command -v bazel >/dev/null 2>&1; then
  step same-sources-as-bazel compare_with_bazel
else
  echo "cmake_check: same-sources-as-bazel skipped (no bazel on PATH)"
fi
step build cmake --build "$work/build" -j "$jobs"
step install cmake --install "$work/build"
step installed-tree check_installed_tree
pcdir=$(dirname "$(find "$prefix" -name msgbus.pc | head -n 1)")
step consumer-find-package consumer_find_package
step consumer-pkg-config-cmake consumer_pkg_config_cmake
step consumer-pkg-config-cxx consumer_pkg_config_cxx
step docs-consumer docs_consumer
echo "cmake_check: ok"
