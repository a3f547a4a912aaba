#!/usr/bin/env bash
# Builds the exact Abseil that Debian ships (the source package of the installed libabsl-dev,
# with Debian's patches) with -fsanitize=thread into /opt/absl-tsan, which `--config=tsan`
# compiles and links against (.bazelrc). Debian's own Abseil is not instrumented, so TSan does
# not see absl::Mutex and reports a race on everything it guards.
#
# Not run by tools/setup.sh: only TSan runs need it. Needs the network to Debian's mirror once
# (tools/apt_source.sh adds deb-src entries for the same mirror if there are none), cmake and
# g++; takes about 10 minutes on 2 cores. Idempotent: returns at once when the prefix is complete.
set -euo pipefail

# .bazelrc names /opt/absl-tsan; ABSL_TSAN_PREFIX is for timing or trying the build elsewhere.
prefix=${ABSL_TSAN_PREFIX:-/opt/absl-tsan}
supp_src="$(cd "$(dirname "$0")" && pwd)/tsan.supp"
version=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null || true)
if [ -z "$version" ]; then
  echo "setup_tsan: libabsl-dev is not installed; run tools/setup.sh first" >&2
  exit 1
fi
stamp="$prefix/.complete"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

# The suppressions (third-party false positives) sit beside the libraries, at the absolute path
# that TSAN_OPTIONS in .bazelrc names; refreshed on every run.
install_suppressions() {
  cmp -s "$supp_src" "$prefix/tsan.supp" ||
    "${sudo_cmd[@]}" install -m 0644 "$supp_src" "$prefix/tsan.supp"
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
  install_suppressions
  echo "setup_tsan: ok ($prefix, abseil $version)"
  exit 0
fi

bash "$(dirname "$0")/apt_install.sh" setup_tsan cmake make g++

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "setup_tsan: fetching abseil $version source"
bash "$(dirname "$0")/apt_source.sh" "$work" "abseil=$version"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'abseil-*')

# Debian's build (debian/rules) is CMake with C++17; the static archives keep the -l names of
# the system @com_google_absl (repositories.bzl) and need no rpath. -O1 as in --config=tsan;
# frame pointers for stacks.
echo "setup_tsan: building into $prefix"
flags="-fsanitize=thread -O1 -g -fno-omit-frame-pointer"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_STANDARD=17 \
  -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log" >&2; exit 1; }
"${sudo_cmd[@]}" rm -rf "$prefix"
"${sudo_cmd[@]}" cmake --install "$work/build" >/dev/null
install_suppressions
echo "$version" | "${sudo_cmd[@]}" tee "$stamp" >/dev/null
echo "setup_tsan: ok ($prefix, abseil $version)"
