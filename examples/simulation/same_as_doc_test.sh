#!/usr/bin/env bash
# Fails, with the difference, when the example file and the doc's block of that name differ.
# Usage: same_as_doc_test.sh doc_block.py DOC.md BLOCK FILE
set -euo pipefail
diff -u <(python3 "$1" "$2" "$3") "$4"
