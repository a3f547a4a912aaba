#!/usr/bin/env bash
# Checks the layout (docs/development.md, "Layout"):
#  0. the include graph against the order of the rooms, and no product function over 80 lines
#     (tools/layout_graph.py, which prints the longest);
#  1. every header a user can depend on (the hdrs of the library targets that a target outside
#     the library, //examples/quickstart, may depend on) includes only project headers that are
#     themselves such public headers: no public header exposes an engine header;
#  2. no product source file (outside tests, benchmarks and examples) is over 600 lines.
# Prints what is wrong and exits 1, or prints a summary and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."

pkgs='//bus/... + //drivers/... + //storage/... + //idempotency/... + //transactional/... + //url/... + //admin/...'
# Packages that may not exist yet are dropped from the expression.
expr=""
for p in bus common drivers storage idempotency transactional testing url admin observability; do
  [ -d "$p" ] && expr="${expr:+$expr + }//$p/..."
done
user=//examples/quickstart:quickstart
libs="attr(testonly, 0, visible($user, kind(cc_library, $expr)))"
public=$(bazel query "kind('source file', labels(hdrs, $libs))" --output=label 2>/dev/null |
  sed -e 's|^//||' -e 's|:|/|' | sort -u)
[ -n "$public" ] || { echo "check_layout: bazel query listed no public headers"; exit 1; }

status=0
python3 tools/layout_graph.py --max-function-lines 80 || status=1

while IFS= read -r h; do
  while IFS= read -r inc; do
    case "$inc" in
      bus/* | common/* | drivers/* | storage/* | idempotency/* | transactional/* | url/* | admin/* | observability/*)
        if ! grep -qxF "$inc" <<<"$public"; then
          echo "check_layout: public header $h includes $inc, which is not a public header"
          status=1
        fi
        ;;
    esac
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$h")
done <<<"$public"

while IFS= read -r f; do
  n=$(wc -l <"$f")
  if [ "$n" -gt 600 ]; then
    # A longer file says why in its first five lines ("Over 600 lines: <reason>"), and is listed.
    if head -n 5 "$f" | grep -q "Over 600 lines: "; then
      echo "check_layout: $f has $n lines; its reason: $(head -n 5 "$f" | sed -n 's/.*Over 600 lines: //p')"
    else
      echo "check_layout: $f has $n lines (at most 600 in product code, or a reason at its top)"
      status=1
    fi
  fi
done < <(find bus common drivers storage idempotency transactional testing url admin observability busctl -name '*.cc' \
  -not -name '*_test.cc' 2>/dev/null | sort)

[ $status -eq 0 ] && echo "check_layout: $(wc -l <<<"$public") public headers, none exposes an engine header; no product .cc over 600 lines without a reason at its top"
exit $status
