#!/usr/bin/env bash
# Runs the quickstart twice over one SQLite file and checks that each summary adds up (it exits
# non-zero otherwise) and that the dead letters of both runs are in the file.
set -euo pipefail
bin="${TEST_SRCDIR}/${TEST_WORKSPACE}/examples/quickstart/quickstart"
db="${TEST_TMPDIR}/bus.db"
for run in 1 2; do
  out=$("$bin" --orders=300 --db="$db")
  echo "$out"
  grep -q "check .*: OK$" <<<"$out"
done
# The inbox mode: exactly one effect row per handled order, every invoice relayed.
out=$("$bin" --orders=300 --db="$db" --inbox)
echo "$out"
grep -q "check           one effect row per handled order .*: OK$" <<<"$out"
grep -q "check           handled + .*: OK$" <<<"$out"
