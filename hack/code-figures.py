#!/usr/bin/env python3
"""Figures about the shape of the code (`make code-figures`; docs/architecture.md, "The code's
shape"):

- the import graph between files (its `use` edges) and every circle in it;
- the functions longer than 50 lines;
- the protocol's reading set: the files that decide who owns a run, and their lines;
- the fence comparisons outside src/fence/: a comparison operator beside an operand named
  `fence` anywhere but the fence rules' own home (docs/protocol.md: every fence rule lives
  there). This is the one copy of that rule: hack/lint-fence.sh is `--fence`, which prints the
  finding alone and exits 1 on any;
- the public fields of structs holding an API client: a struct with a field whose type names a
  kube handle that can write (`Client`, `Api<..>`, `LeaseClient`, `SegmentStore`, `Recorder`),
  and its `pub`/`pub(crate)`/`pub(super)` fields. The aim is one writer by type: a write to the
  API server goes through the type that owns the handle and the state beside it (the fence, the
  run it holds), so no one reaches the raw handle, or that state, through a public field and
  writes around the owner's rules;
- the source files over 500 lines, in src/, tests/, examples/, benches/ and testkit/;
- the modules of one process (controller/, worker/, server/, cli/, webhook/) that import
  another's: what two processes share belongs to the kernel (crd/, fence/, ledger/, access/,
  display/, …), so each process can change without reaching into a sibling; the exceptions,
  each with its reason, are SIDEWAYS_ALLOWED;
- the README's lines: it is a front door (what baton is, why, the quick start, a short install,
  links), and everything else lives in docs/, so it stays short as features land;
- the docs references that do not resolve: links, anchors, backticked paths and names, and cited
  sections of the docs and of the code that names them (hack/check-docs.py, read here);
- the HTTP listeners not served by the one serving layer (src/serving/): a server library called
  directly, or a `TcpListener` bound in a file that never hands one to `serving::serve`;
- the modules mounted by `#[path]` in tests/, benches/, examples/ and testkit/: what they share
  is the test kit, a crate each of them names the same way.

`--check` exits 1 when the import graph has a circle, or when one of the last eight figures is
above its ceiling (the constants below): `make lint` runs it, so a circle cannot land and those
figures can only go down.

What counts as an edge: a `use` (or an inline `crate::`/`super::` path) in file A naming an
item of file B, B being the deepest module file the path reaches. A module's own `mod.rs`
re-exporting its children (`pub use child::X`) is its interface, not a dependency, so edges
from a `mod.rs` to files below it are left out. The parser is a reading of Rust's surface
syntax (it strips comments and string literals first), not a compiler: it is exact for this
code base, which has no macros that import.
"""

import importlib.util
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
LONG_FUNCTION = 50
LONG_FILE = 500
# The files that decide ownership of a run (the fence rule): what a reader of the protocol reads.
READING_SET = ["fence/mod.rs", "fence/value.rs", "controller/claim.rs", "worker/holder.rs"]

# `--check` fails when a figure is above its ceiling. Each was set to what the code had when the
# figure came in: a ceiling may only go down (to the figure, as the work lands), never up to let
# code through.
CEILING_FENCE_COMPARISONS = 0
CEILING_PUBLIC_WRITER_FIELDS = 0
CEILING_LONG_FILES = 0
# The README as a front door: about 150 lines (controller-rs and operator-rs keep 60 to 130).
CEILING_README_LINES = 160
CEILING_SIDEWAYS_IMPORTS = 0

# The top-level modules that are a process of their own (a binary's subcommand).
PROCESSES = ("controller", "worker", "server", "cli", "webhook")
# (importing process, imported process): why it may.
SIDEWAYS_ALLOWED = {
    ("controller", "webhook"): "every controller replica serves the admission webhook in its "
    "own process (`webhook::run`, started by the reconciler; its flags are the controller's)",
}
CEILING_UNRESOLVED_DOCS = 0
# Every HTTP listener is served by src/serving/ (its bounds, TLS, stop, spans).
CEILING_OWN_LISTENERS = 0
# What tests, benchmarks and examples share is the test kit (testkit/), named the same everywhere.
CEILING_PATH_MOUNTS = 0
PATH_MOUNT = re.compile(r"#\[path\s*=")

# What serves HTTP without the serving layer: a server library called directly, or a listener
# bound in a file that never hands one to `serving::serve`.
OWN_SERVER = re.compile(
    r"\baxum_server::|\baxum::serve\b|\bserve_connection\b|\bhyper(?:_util)?::server\b"
    r"|\bTowerToHyperService\b"
)
TCP_BIND = re.compile(r"\bTcpListener::bind\b")

# A comparison operator beside an operand named `fence`: `fence`, `s.fence`, `*fence`,
# `Some(fence)`, `fence.get()`, `spec.fence`. On the left the `\b` anchors the name (a leading
# `*`/`&` does not change what is compared); on the right the character before `<`/`>` keeps out
# `->`, `=>`, `<<`, `>>`, and the space after keeps out generics (`Option<Fence>`).
FENCE_OPERAND = r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*fence(?:\(\))?(?:\.get\(\))?"
FENCE_COMPARISON = re.compile(
    rf"\b{FENCE_OPERAND}\s*(?:==|!=|<=|>=|<[^<=]|>[^>=])"
    rf"|(?:==|!=|<=|>=|[^-=<]<\s|[^-=>]>\s)\s*(?:Some\()?[*&]?{FENCE_OPERAND}\b"
)
FENCE_MESSAGE = (
    "fence compared outside src/fence/ (use its rules: lease_reached, lease_held, status_names,"
    " superseded, follows, may_append_at, Fence::is_first/never_claimed):"
)

# The kube handles that can write. A `Client` named through another crate's path
# (`reqwest::Client`, a model provider's HTTP client) is not one; a bare `Client` is kube's here.
WRITER = re.compile(
    r"(?<!::)\bClient\b|\bkube::(?:client::)?Client\b|\bApi<|\bLeaseClient\b|\bSegmentStore\b"
    r"|\bRecorder\b"
)


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


def rust_files(*dirs):
    """Every .rs file under the given top-level directories, as a path from the repository root."""
    out = []
    for top in dirs:
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(root, f), ROOT)
                    out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def fence_exempt(rel):
    """The files the fence rule does not read: the rules' own home (src/fence/, its tests
    included), unit-test files, and src/cli/describe.rs, which groups the ledger's events by
    attempt for display and decides nothing."""
    return (
        rel == "src/cli/describe.rs"
        or rel.startswith("src/fence/")
        or rel.endswith("_tests.rs")
    )


def fence_comparisons():
    """`path:line: code` of every fence compared by hand. The code is read stripped, so a
    comparison in a comment or a string (a message, not a decision) is not one."""
    found = []
    for rel in rust_files("src"):
        if fence_exempt(rel):
            continue
        text = read(rel)
        code = strip(text).split("\n")
        for n, line in enumerate(text.split("\n")):
            if FENCE_COMPARISON.search(code[n]):
                found.append(f"{rel}:{n + 1}: {line.strip()}")
    return found


def item_end(code, i):
    """The index past the item that starts at `i`: past the `;` or the `}` that ends it at its
    own depth (`use x;`, `struct S(u8);`, `fn f() { .. }`, `mod tests { .. }`)."""
    depth = 0
    for j in range(i, len(code)):
        ch = code[j]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and ch == "}":
                return j + 1
        elif ch == ";" and depth == 0:
            return j + 1
    return len(code)


def bracket_end(code, i):
    """The index past the bracket that closes the one opening at `i`."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] in "([{":
            depth += 1
        elif code[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def without_test_items(code):
    """The code with each `#[cfg(test)]` item (a test module, a helper) blanked, lines kept:
    what the library is built from."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", code)
        if not m:
            return code
        end = item_end(code, m.end())
        code = code[: m.start()] + "\n" * code[m.start() : end].count("\n") + code[end:]


def fields(body):
    """The fields of a struct body (inside its braces or parentheses), attributes dropped: split
    at the commas that are not inside a type's brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(body + ","):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}" or (ch == ">" and body[i - 1] != "-"):
            depth -= 1
        elif ch == "," and depth == 0:
            field = re.sub(r"#\[[^\]]*\]", "", body[start:i]).strip()
            start = i + 1
            if field:
                out.append(field)
    return out


def struct_bodies(code):
    """(name, line, body) of every struct with fields: the body is what its first `{` or `(`
    after the name (and its generics) encloses. A unit struct (`;` first) has none."""
    for m in re.finditer(r"\bstruct\s+(\w+)", code):
        depth = 0
        for i in range(m.end(), len(code)):
            ch = code[i]
            if ch == "<":
                depth += 1
            elif ch == ">" and code[i - 1] != "-":
                depth -= 1
            elif depth == 0 and ch in "{(;":
                break
        if ch == ";":
            continue
        end = bracket_end(code, i)
        yield m.group(1), code[: m.start()].count("\n") + 1, code[i + 1 : end - 1]


def public_writer_fields():
    """(public fields, `path:line Name`) of every struct outside tests that holds a writer and
    has a public field. Every visibility counts: `pub(crate)` and `pub(super)` open a field to
    the code that would write around its owner as surely as `pub` does."""
    found = []
    for rel in rust_files("src"):
        if rel.endswith("_tests.rs") or rel.endswith("/tests.rs"):
            continue
        code = without_test_items(strip(read(rel)))
        for struct, line, body in struct_bodies(code):
            fs = fields(body)
            if not any(WRITER.search(f) for f in fs):
                continue
            public = sum(1 for f in fs if re.match(r"pub\b", f))
            if public:
                found.append((public, f"{rel}:{line} {struct}"))
    return sorted(found, key=lambda x: (-x[0], x[1]))


def long_files():
    """(lines, path) of every source file, code or test, over LONG_FILE lines."""
    found = []
    for rel in rust_files("src", "tests", "examples", "benches", "testkit"):
        with open(os.path.join(ROOT, rel)) as f:
            lines = sum(1 for _ in f)
        if lines > LONG_FILE:
            found.append((lines, rel))
    return sorted(found, key=lambda x: (-x[0], x[1]))


def sideways_imports():
    """`importer -> imported` of every import from one process's module into another's, but
    the SIDEWAYS_ALLOWED pairs."""
    found = []
    for mod, targets in sorted(graph(module_files()).items()):
        for target in sorted(targets):
            if not (mod and target) or mod[0] == target[0]:
                continue
            pair = (mod[0], target[0])
            if pair[0] in PROCESSES and pair[1] in PROCESSES and pair not in SIDEWAYS_ALLOWED:
                found.append(f"{name(mod)} -> {name(target)}")
    return found


def own_listeners():
    """`file:line` of every HTTP listener outside src/serving/ that is not served by it, in the
    code the library is built from (tests bind their own)."""
    found = []
    for rel in rust_files("src"):
        if rel.startswith("src/serving/"):
            continue
        code = without_test_items(strip(read(rel)))
        handed = "serving::serve" in code or "serving::{" in code
        for number, line in enumerate(code.splitlines(), 1):
            if OWN_SERVER.search(line) or (TCP_BIND.search(line) and not handed):
                found.append(f"{rel}:{number}")
    return found


def path_mounts():
    """`file:line` of every module mounted by `#[path]` in the tests, benchmarks and examples."""
    found = []
    for rel in rust_files("tests", "benches", "examples", "testkit"):
        for number, line in enumerate(strip(read(rel)).splitlines(), 1):
            if PATH_MOUNT.search(line):
                found.append(f"{rel}:{number}")
    return found


def readme_lines():
    """The README's lines."""
    with open(os.path.join(ROOT, "README.md")) as f:
        return sum(1 for _ in f)


def unresolved_docs():
    """`file:line: problem` of every docs reference that does not resolve, from
    hack/check-docs.py (one rule, one copy: `make lint` also runs that script alone)."""
    spec = importlib.util.spec_from_file_location(
        "check_docs", os.path.join(ROOT, "hack", "check-docs.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.problems()


def name(mod):
    return "/".join(mod) or "lib"


def ceilinged_figures():
    """(title, figure, ceiling, offenders) of the figures `--check` holds to a ceiling."""
    fences = fence_comparisons()
    writers = public_writer_fields()
    files = long_files()
    docs = unresolved_docs()
    sideways = sideways_imports()
    listeners = own_listeners()
    mounts = path_mounts()
    return [
        ("fence comparisons outside src/fence/", len(fences), CEILING_FENCE_COMPARISONS, fences),
        (
            "public fields of structs holding an API client",
            sum(n for n, _ in writers),
            CEILING_PUBLIC_WRITER_FIELDS,
            [f"{n:4d}  {where}" for n, where in writers],
        ),
        (
            f"source files over {LONG_FILE} lines",
            len(files),
            CEILING_LONG_FILES,
            [f"{n:4d}  {rel}" for n, rel in files],
        ),
        (
            "modules importing a sibling process",
            len(sideways),
            CEILING_SIDEWAYS_IMPORTS,
            sideways,
        ),
        ("README lines", readme_lines(), CEILING_README_LINES, []),
        ("docs references that do not resolve", len(docs), CEILING_UNRESOLVED_DOCS, docs),
        (
            "listeners not served by the one serving layer",
            len(listeners),
            CEILING_OWN_LISTENERS,
            listeners,
        ),
        ("`#[path]` in tests, benchmarks and examples", len(mounts), CEILING_PATH_MOUNTS, mounts),
    ]


def fence_lint():
    """`--fence` (hack/lint-fence.sh): the fence finding alone, silent when clean."""
    found = fence_comparisons()
    if found:
        print(FENCE_MESSAGE, file=sys.stderr)
        print("\n".join(found), file=sys.stderr)
        return 1
    return 0


def main():
    if "--fence" in sys.argv:
        return fence_lint()
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
    figures = ceilinged_figures()
    for title, figure, _, offenders in figures:
        print(f"{title}: {figure}")
        for line in offenders:
            print("  " + line)
    if "--check" not in sys.argv:
        return 0
    failed = False
    if found:
        print("the import graph of src/ has a circle", file=sys.stderr)
        failed = True
    for title, figure, ceiling, offenders in figures:
        if figure > ceiling:
            print(f"{title}: {figure}, above its ceiling of {ceiling}:", file=sys.stderr)
            for line in offenders:
                print("  " + line, file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
