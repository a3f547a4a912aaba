#!/usr/bin/env python3
"""Turns the C++ code blocks of Markdown files into one GoogleTest source file, so that the docs
a user copies from are compiled and run by the test suite (//tests/docs:doc_snippets_test).

Every ```cpp block of every file given is taken; none can opt out. A block is one of:

  * a translation unit: it defines something at file scope (a TEST, a function, a class). Its
    code goes into a namespace of its own and its TESTs run as they are.
  * a fragment: statements, as a user pastes them into a function of theirs. They become the
    body of `absl::Status Snippet()` (so `return st;` works), run by a generated TEST that
    expects OK. A line that is only `...` (the doc's "your code here") is dropped.

A fragment may use names the prose around it takes for granted (the application's functions,
a database opened further up). An HTML comment right before the block, invisible when the page
is rendered, supplies them:

  <!-- doc-check prelude
  bool Charge(const std::string&, const std::string&) { return true; }
  -->
  <!-- doc-check setup
  bus::HandlerOptions options;
  -->
  <!-- doc-check after
  if (!handler.ok()) return handler.status();
  -->

`prelude` goes at namespace scope before the block, `setup` at the start of the function body,
`after` after the block's statements (to check what the block made).
#include lines of every block and annotation are collected at the top of the file.

Usage: doc_snippets.py FILE.md... > doc_snippets_test.cc
"""

import os
import re
import sys

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
ANNOTATION = re.compile(r"^\s*<!--\s*doc-check\s+(prelude|setup|after)\s*$")
# File-scope definitions: a TEST, a type, a namespace, or a function definition's first line.
TOP_LEVEL = re.compile(
    r"^(TEST(_F|_P)?\(|class |struct |namespace |template\s*<|"
    r"[A-Za-z_][\w:<>,\s\*&]*\s[\*&]?[A-Za-z_]\w*\([^;]*\)\s*(const\s*)?(\{|$))")


def blocks(path):
    """Yields (line number, info, code lines, {annotation: lines}) for each fenced block."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    pending = {}
    i = 0
    while i < len(lines):
        m = ANNOTATION.match(lines[i])
        if m:
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != "-->":
                body.append(lines[i])
                i += 1
            pending[m.group(1)] = body
            i += 1
            continue
        m = FENCE.match(lines[i])
        if m:
            indent, info = len(m.group(1)), m.group(2)
            start = i + 1
            code = []
            i += 1
            while i < len(lines) and not FENCE.match(lines[i]):
                code.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
                i += 1
            yield start, info, code, pending
            pending = {}
            i += 1
            continue
        if lines[i].strip():
            pending = {}  # an annotation belongs to the block right after it
        i += 1


def main(paths):
    includes = []
    units = []
    count = 0
    for path in paths:
        name = re.sub(r"\W", "_", os.path.basename(path).rsplit(".", 1)[0]).lower()
        for line_no, info, code, notes in blocks(path):
            if info != "cpp":
                continue
            count += 1
            ns = f"doc_{name}_line{line_no}"
            body = []
            for line in code:
                if line.startswith("#include"):
                    if line not in includes:
                        includes.append(line)
                elif line.strip() != "...":
                    body.append(line)
            where = f"// {path}, the block at line {line_no}"
            for line in sum(notes.values(), []):
                if line.startswith("#include") and line not in includes:
                    includes.append(line)
            notes = {k: [l for l in v if not l.startswith("#include")] for k, v in notes.items()}
            prelude = notes.get("prelude", [])
            setup = notes.get("setup", [])
            after = notes.get("after", [])
            if any(TOP_LEVEL.match(line) for line in body):
                units.append("\n".join([where, f"namespace {ns} {{", *prelude, *body,
                                        f"}}  // namespace {ns}", ""]))
            else:
                units.append("\n".join([
                    where,
                    f"namespace {ns} {{",
                    *prelude,
                    "absl::Status Snippet() {",
                    *setup,
                    *body,
                    *after,
                    "  return absl::OkStatus();",
                    "}",
                    f"TEST(DocSnippets, {ns}) {{",
                    "  const absl::Status st = Snippet();",
                    "  EXPECT_TRUE(st.ok()) << st;",
                    "}",
                    f"}}  // namespace {ns}",
                    "",
                ]))
    if count == 0:
        sys.exit("doc_snippets.py: no ```cpp block in " + " ".join(paths))
    out = ["// Generated by tools/doc_snippets.py from " + ", ".join(paths) + "; do not edit.",
           '#include "absl/status/status.h"', '#include "gtest/gtest.h"', *includes, "",
           *units]
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
