#!/usr/bin/env python3
"""Prints one fenced code block of a Markdown file: the block right after the (invisible when
rendered) comment `<!-- doc-check block NAME -->`. The check scripts (tools/consumer_check.sh,
tools/cmake_check.sh) run the steps a doc gives from the doc itself, so the two cannot drift.
Exits 1, naming what is missing, when there is no such block.

Usage: doc_block.py FILE.md NAME
"""

import re
import sys


def main(path, name):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    marker = re.compile(r"^\s*<!--\s*doc-check\s+block\s+" + re.escape(name) + r"\s*-->\s*$")
    for i, line in enumerate(lines):
        if not marker.match(line):
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        fence = re.match(r"^(\s*)```", lines[j]) if j < len(lines) else None
        if not fence:
            sys.exit(f"doc_block.py: {path}:{i + 1}: no code block after the marker {name}")
        indent = len(fence.group(1))
        out = []
        for code in lines[j + 1:]:
            if re.match(r"^\s*```\s*$", code):
                sys.stdout.write("\n".join(out) + "\n")
                return
            out.append(code[indent:] if code[:indent].strip() == "" else code)
        sys.exit(f"doc_block.py: {path}: the block {name} is not closed")
    sys.exit(f"doc_block.py: {path}: no block marked {name}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
