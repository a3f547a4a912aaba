#!/usr/bin/env bash
# Runs the quickstart and checks that its summary adds up (it exits non-zero otherwise).
set -euo pipefail
out=$("${TEST_SRCDIR}/${TEST_WORKSPACE}/examples/quickstart/quickstart" --orders=300)
echo "$out"
grep -q "check .*: OK$" <<<"$out"
