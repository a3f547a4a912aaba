#!/usr/bin/env python3
"""The include graph and the function lengths of the product code, for tools/check_layout.sh.

Rooms and their order come from the table in docs/development.md ("Rooms"): a row
"| <level> | `room/`, `room/` | ... |". A file's room is its top-level folder. Product files are
the .h and .cc files under a room, without *_test.cc and *_bench.cc. Rules, each printed as
"check_layout: <file>: ..." when broken:
  1. a room includes only itself and rooms of a lower level (no arrow up, none between siblings
     such as drivers/, storage/ and idempotency/);
  2. a header under an internal/ folder is included only from the folder that holds that
     internal/ (drivers/nsq/internal/ from drivers/nsq/), and common/<backend>/internal/ also
     from the same backend's packages in the rooms above (drivers/redis/, storage/redis/, ...);
     the table's "internal reach" rows name any other reach allowed.
Then it prints the longest product functions (a brace-matching scan of the .cc files: a
definition starts at a line in column 0 that holds "(" and ends with "{").
Exit status: 1 when a rule is broken (or, with --max-function-lines N, a function is longer).
"""
import os
import re
import sys

DOC = "docs/development.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|([^|]*)\|")
REACH = re.compile(r"^\|\s*reach\s*\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_rooms():
    levels, reach = {}, []
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if m:
                for room in re.findall(r"`([a-z_]+)/`", m.group(2)):
                    levels[room] = int(m.group(1))
            m = REACH.match(line)
            if m:
                reach.append((m.group(1).rstrip("/") + "/", m.group(2).rstrip("/") + "/"))
    return levels, reach


def product_files(levels):
    for room in sorted(levels):
        for root, _, names in os.walk(room):
            for name in sorted(names):
                if not name.endswith((".h", ".cc")) or name.endswith(("_test.cc", "_bench.cc")):
                    continue
                yield os.path.join(root, name)


def internal_owner(path):
    """The folder that holds the internal/ of `path`, or None."""
    parts = path.split("/")
    if "internal" not in parts[:-1]:
        return None
    return "/".join(parts[: parts.index("internal")])


def may_reach(src, owner, reach):
    if src.startswith(owner + "/"):
        return True
    parts = owner.split("/")
    if parts[0] == "common" and len(parts) == 2:
        backend = parts[1]
        src_parts = src.split("/")
        if len(src_parts) > 2 and src_parts[1] == backend:
            return True
    return any(src.startswith(f) and (owner + "/").startswith(t) for f, t in reach)


def check_includes(levels, reach):
    errors, edges = [], 0
    for src in product_files(levels):
        room = src.split("/")[0]
        with open(src, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                target = inc.split("/")[0]
                if target not in levels:
                    continue
                edges += 1
                if target != room and levels[target] >= levels[room]:
                    kind = "a sibling of" if levels[target] == levels[room] else "above"
                    errors.append(f"{src}:{n}: includes {inc}: {target}/ is {kind} {room}/ "
                                  f"({DOC}, Layout)")
                owner = internal_owner(inc)
                if owner is not None and not may_reach(src, owner, reach):
                    errors.append(f"{src}:{n}: includes {inc}, internal to {owner}/")
    return errors, edges


DEFINITION = re.compile(r"^[A-Za-z_~].*\(.*")
NOT_FUNCTION = re.compile(r"^(namespace|class|struct|enum|union|extern|using|typedef|#)")


def functions(path):
    """(name, first line, lines) of the functions defined at column 0 in `path`."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if DEFINITION.match(line) and not NOT_FUNCTION.match(line):
            # The signature may span lines; the body opens with the first "{" at its end.
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith("{") and ";" not in lines[j]:
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                depth, k = 0, j
                while k < len(lines):
                    code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|//.*', "", lines[k])
                    depth += code.count("{") - code.count("}")
                    if depth <= 0 and k > j or (depth == 0 and k == j and "}" in code):
                        break
                    k += 1
                name = re.match(r"^.*?([A-Za-z_~][\w:~<>]*)\s*\(", " ".join(lines[i:j + 1]))
                out.append((name.group(1) if name else "?", i + 1, k - i + 1))
                i = k + 1
                continue
        i += 1
    return out


def main():
    max_lines = None
    if len(sys.argv) == 3 and sys.argv[1] == "--max-function-lines":
        max_lines = int(sys.argv[2])
    levels, reach = read_rooms()
    if not levels:
        print(f"check_layout: no rooms table in {DOC}")
        return 1
    errors, edges = check_includes(levels, reach)
    for e in errors:
        print(f"check_layout: {e}")
    found = []
    for path in product_files(levels):
        if path.endswith(".cc"):
            found += [(n, path, first, name) for name, first, n in functions(path)]
    found.sort(reverse=True)
    over = [f for f in found if f[0] > 80]
    print(f"check_layout: {len(over)} product functions over 80 lines; the longest:")
    for n, path, first, name in found[:max(5, len(over))]:
        print(f"  {n:4d} lines  {path}:{first}  {name}")
    status = 1 if errors else 0
    if max_lines is not None and any(f[0] > max_lines for f in found):
        status = 1
    if not errors:
        order = " < ".join("/".join(sorted(r for r in levels if levels[r] == lv))
                           for lv in sorted(set(levels.values())))
        print(f"check_layout: {edges} includes between rooms ({order}), none against the order "
              f"or into another package's internal/")
    return status


if __name__ == "__main__":
    sys.exit(main())
