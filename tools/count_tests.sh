#!/usr/bin/env bash
# Counts test cases (not targets) in the gtest XML reports under bazel-testlogs and prints one
# line "N passed, N failed". A target that crashed before writing its own report is counted
# through the report Bazel writes for it (one failed case).
set -euo pipefail
logs=${1:-bazel-testlogs}
passed=0
failed=0
while IFS= read -r -d '' xml; do
  read -r p f < <(awk '
    /<testcase/ { if (open) { if (bad) f++; else if (!skip) p++ } open=1; bad=0; skip=0
                  if ($0 ~ /result="skipped"/ || $0 ~ /status="notrun"/) skip=1 }
    /<failure|<error/ { if (open) bad=1 }
    END { if (open) { if (bad) f++; else if (!skip) p++ } print p+0, f+0 }' "$xml")
  passed=$((passed + p))
  failed=$((failed + f))
done < <(find -L "$logs" -name test.xml -print0 2>/dev/null)
echo "${passed} passed, ${failed} failed"
