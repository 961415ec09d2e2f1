#!/usr/bin/env python3
"""Figures about the shape of src/ that the README reports (`make code-figures`):

- the import graph between files (its `use` edges) and every circle in it;
- the functions longer than 50 lines;
- the protocol's reading set: the files that decide who owns a run, and their lines.

`--check` exits 1 when the import graph has a circle: `make lint` runs it, so a circle
cannot land.

What counts as an edge: a `use` (or an inline `crate::`/`super::` path) in file A naming an
item of file B, B being the deepest module file the path reaches. A module's own `mod.rs`
re-exporting its children (`pub use child::X`) is its interface, not a dependency, so edges
from a `mod.rs` to files below it are left out. The parser is a reading of Rust's surface
syntax (it strips comments and string literals first), not a compiler: it is exact for this
code base, which has no macros that import.
"""

import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
LONG_FUNCTION = 50
# The files that decide ownership of a run (the fence rule): what a reader of the protocol reads.
READING_SET = ["fence.rs", "controller/claim.rs", "worker/holder.rs"]


def module_files():
    """Module path (tuple) -> file path relative to src/."""
    mods = {}
    for root, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), SRC)
            parts = rel[:-3].split(os.sep)
            if parts[0] == "bin":
                continue
            if parts[-1] in ("mod", "lib"):
                parts = parts[:-1]
            mods[tuple(parts)] = rel
    return mods


def strip(text):
    """The code without comments, string and char literals (their braces and paths are not code).
    One left-to-right pass, so a quote inside a comment or a `//` inside a string is read right."""
    token = re.compile(
        r"//[^\n]*|/\*.*?\*/|\bb?r(#*)\"(?:.|\n)*?\"\1|b?\"(?:\\.|[^\"\\])*\"|b?'(?:\\.|[^'\\])'",
        re.S,
    )

    def blank(m):
        return "\n" * m.group(0).count("\n") + ('""' if m.group(0)[-1:] in "\"#'" else "")

    return token.sub(blank, text)


def use_paths(code):
    """Every path a file names: the trees of its `use` items, flattened, and inline paths."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        paths.extend(expand(m.group(1).replace("\n", " ")))
    for m in re.finditer(r"\b((?:crate|super)(?:::\w+)+)", code):
        paths.append(m.group(1).split("::"))
    return paths


def expand(tree):
    """`a::{b, c::{d, e}}` -> [[a,b], [a,c,d], [a,c,e]]."""
    tree = tree.strip()
    depth, brace = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                brace = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if brace is None:
        return [[p.strip() for p in tree.split(" as ")[0].split("::") if p.strip()]]
    prefix = [p for p in tree[:brace].split("::") if p.strip()]
    inner = tree[brace + 1 : tree.rindex("}")]
    out, depth, start = [], 0, 0
    for i, ch in enumerate(inner + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            part = inner[start:i].strip()
            start = i + 1
            if part and part != "self":
                out.extend(prefix + sub for sub in expand(part))
            elif part == "self":
                out.append(prefix)
    return out


def resolve(path, here, mods):
    """The module file an item path lands in, or None (an outside crate)."""
    if not path:
        return None
    if path[0] == "crate":
        base, rest = (), path[1:]
    elif path[0] in ("super", "self"):
        base = here
        while path and path[0] in ("super", "self"):
            if path[0] == "super":
                base = base[:-1]
            path = path[1:]
        rest = path
    else:
        # `use child::X` inside a mod.rs, or an outside crate.
        if here + (path[0],) in mods:
            base, rest = here, path
        else:
            return None
    best = base if base in mods else None
    cur = base
    for part in rest:
        cur = cur + (part,)
        if cur in mods:
            best = cur
        else:
            break
    return best


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    is_mod = parts[-1] in ("mod", "lib")
    if is_mod:
        parts = parts[:-1]
    return tuple(parts), is_mod


def graph(mods):
    edges = {}
    for mod, rel in mods.items():
        with open(os.path.join(SRC, rel)) as f:
            code = strip(f.read())
        here, is_mod = module_of(rel)
        # In a file `a/b.rs`, `super` is `a`; in `a/mod.rs`, `self` is `a` and `super` its parent.
        scope = here if is_mod else here
        targets = set()
        for p in use_paths(code):
            start = scope if is_mod else here
            if p[0] == "super" and not is_mod:
                p = ["self"] + p  # `super` of a file module is its parent: one level from `here`
            t = resolve(p, start, mods)
            if t is None or t == mod:
                continue
            if is_mod and t[: len(mod)] == mod:
                continue  # a module's interface re-exporting its children
            targets.add(t)
        edges[mod] = targets
    return edges


def circles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def long_functions(mods):
    found = []
    for rel in sorted(mods.values()):
        with open(os.path.join(SRC, rel)) as f:
            lines = strip(f.read()).split("\n")
        for i, line in enumerate(lines):
            m = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?fn\s+(\w+)", line)
            if not m:
                continue
            depth, opened, j = 0, False, i
            while j < len(lines):
                for ch in lines[j]:
                    if ch == "{":
                        depth += 1
                        opened = True
                    elif ch == "}":
                        depth -= 1
                if opened and depth <= 0:
                    break
                if not opened and lines[j].rstrip().endswith(";"):
                    break  # a declaration without a body
                j += 1
            length = j - i + 1
            if opened and length > LONG_FUNCTION:
                found.append((length, f"{rel}:{i + 1} {m.group(1)}"))
    return sorted(found, reverse=True)


def name(mod):
    return "/".join(mod) or "lib"


def main():
    mods = module_files()
    edges = graph(mods)
    found = circles(edges)
    print(f"files: {len(mods)}, import edges: {sum(len(t) for t in edges.values())}")
    print(f"import circles: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(name(m) for m in comp))
    longs = long_functions(mods)
    print(f"functions over {LONG_FUNCTION} lines: {len(longs)}")
    for length, where in longs:
        print(f"  {length:4d}  {where}")
    total = 0
    present = [f for f in READING_SET if os.path.exists(os.path.join(SRC, f))]
    for f in present:
        with open(os.path.join(SRC, f)) as fh:
            total += sum(1 for _ in fh)
    print(f"protocol reading set: {len(present)} files, {total} lines ({', '.join(present)})")
    if "--check" in sys.argv and found:
        print("the import graph of src/ has a circle", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
