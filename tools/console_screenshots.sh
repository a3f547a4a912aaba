#!/usr/bin/env bash
# Runs the web console's browser test and copies the screenshots it takes of each page into
# docs/images/ (docs/console.md shows them).
#
#   bash tools/console_screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bazel test //admin:console_browser_test --cache_test_results=no
outputs=bazel-testlogs/admin/console_browser_test/test.outputs
mkdir -p docs/images
if [ -f "$outputs/outputs.zip" ]; then
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$outputs/outputs.zip" "$outputs"
fi
for page in overview queue dead-letters letter purge-confirm hostile; do
  cp "$outputs/$page.png" "docs/images/console-$page.png"
done
echo "console_screenshots: $(ls docs/images/console-*.png | wc -l) screenshots in docs/images/"
