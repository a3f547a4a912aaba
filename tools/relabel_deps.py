#!/usr/bin/env python3
"""Relabels every BUILD file's Abseil, GoogleTest and Benchmark deps to the canonical names.

//third_party:absl / :absl_flags become the @com_google_absl targets whose headers the target's
own sources (srcs, hdrs, textual_hdrs; for a genrule's output, the genrule's inputs) #include;
//third_party:gtest, :gtest_main and :benchmark become their upstream names. Run from the
workspace root; rewrites only the deps lists it changes.
"""
import ast
import glob
import os
import re
import sys

ABSL = "@com_google_absl//absl/"
HEADER_TARGETS = [
    (r"absl/base/(thread_annotations|const_init|attributes|macros|optimization)\.h", "base:core_headers"),
    (r"absl/base/internal/endian\.h", "base:endian"),
    (r"absl/cleanup/cleanup\.h", "cleanup"),
    (r"absl/container/(flat_hash_map|flat_hash_set|node_hash_map|inlined_vector)\.h", "container:\\1"),
    (r"absl/flags/(flag|declare)\.h", "flags:flag"),
    (r"absl/flags/(parse|reflection|commandlineflag)\.h", "flags:\\1"),
    (r"absl/functional/function_ref\.h", "functional:function_ref"),
    (r"absl/hash/hash\.h", "hash"),
    (r"absl/random/random\.h", "random"),
    (r"absl/status/status\.h", "status"),
    (r"absl/status/statusor\.h", "status:statusor"),
    (r"absl/strings/str_format\.h", "strings:str_format"),
    (r"absl/strings/cord\.h", "strings:cord"),
    (r"absl/strings/[a-z_]+\.h", "strings"),
    (r"absl/synchronization/(mutex|notification)\.h", "synchronization"),
    (r"absl/time/(time|clock)\.h", "time"),
    (r"absl/types/span\.h", "types:span"),
]
RENAMED = {
    "//third_party:gtest": "@com_google_googletest//:gtest",
    "//third_party:gtest_main": "@com_google_googletest//:gtest_main",
    "//third_party:benchmark": "@com_github_google_benchmark//:benchmark",
}
OLD_ABSL = {"//third_party:absl", "//third_party:absl_flags"}
# Anywhere on a line: a genrule's tool (tools/doc_snippets.py) writes its includes from strings.
INCLUDE = re.compile(r'#\s*include\s+["<](absl/[^">]+)[">]')


def absl_label(header):
    for pattern, target in HEADER_TARGETS:
        m = re.fullmatch(pattern, header)
        if m:
            return ABSL + m.expand(target)
    sys.exit(f"relabel: no Abseil target known for {header}")


def sort_key(label):  # buildifier's order: ":x", then "//x", then "@x"
    phase = 1 if label.startswith(":") else 2 if label.startswith("//") else 3
    return (phase, label.replace(":", ".").split("."))


def strings(node):
    return [e.value for e in node.elts if isinstance(e, ast.Constant)] if isinstance(node, ast.List) else []


def relabel(build):
    pkg = os.path.dirname(build)
    text = original = open(build).read()
    tree = ast.parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    genrules = {}
    for c in calls:
        kw = {k.arg: k.value for k in c.keywords}
        if c.func.id == "genrule":
            files = strings(kw.get("srcs")) + strings(kw.get("tools"))
            genrules[":" + kw["name"].value] = files
    lists = {}  # module-level NAME = [...]
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.List):
            lists[stmt.targets[0].id] = stmt.value

    def path_of(label):
        if label.startswith("//"):
            return os.path.join(*label[2:].split(":"))
        return os.path.join(pkg, label.lstrip(":"))

    def headers(kw):
        found = set()
        files = []
        for attr in ("srcs", "hdrs", "textual_hdrs"):
            for f in strings(kw.get(attr)):
                files += [path_of(g) for g in genrules[f]] if f in genrules else [path_of(f)]
        for f in files:
            if os.path.isfile(f):
                found |= set(INCLUDE.findall(open(f).read()))
        return found

    # deps list node -> the Abseil headers of every target that uses it.
    wanted = {}
    for c in calls:
        if c.func.id not in ("cc_library", "cc_test", "cc_binary"):
            continue
        kw = {k.arg: k.value for k in c.keywords}
        deps = kw.get("deps")
        if isinstance(deps, ast.Name):
            deps = lists[deps.id]
        hs = headers(kw)
        if deps is None:
            if hs:
                sys.exit(f"relabel: {build}: {kw['name'].value} includes Abseil and has no deps")
            continue
        wanted.setdefault(id(deps), (deps, set()))[1].update(hs)

    edits = []
    for deps, hs in wanted.values():
        old = strings(deps)
        new = [RENAMED.get(d, d) for d in old if d not in OLD_ABSL]
        new += sorted({absl_label(h) for h in hs} - set(new))
        new = sorted(set(new), key=sort_key)
        if new != old:
            edits.append((deps, new))

    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for deps, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        start = offsets[deps.lineno - 1] + deps.col_offset
        end = offsets[deps.end_lineno - 1] + deps.end_col_offset
        indent = re.match(r"\s*", lines[deps.lineno - 1]).group(0)
        if len(new) == 1:
            body = f'["{new[0]}"]'
        else:
            body = "[\n" + "".join(f'{indent}    "{d}",\n' for d in new) + indent + "]"
        text = text[:start] + body + text[end:]
    for old, new in RENAMED.items():  # outside deps lists too (an alias's actual)
        text = text.replace(f'"{old}"', f'"{new}"')
    if text != original:
        open(build, "w").write(text)
    return len(edits)


total = 0
for build in sorted(glob.glob("**/BUILD.bazel", recursive=True)):
    if build.startswith("third_party/"):
        continue
    total += relabel(build)
print(f"relabel: {total} deps lists rewritten")
