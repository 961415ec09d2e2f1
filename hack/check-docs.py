#!/usr/bin/env python3
"""Keeps the docs true (`make lint`): every file, anchor, name and section they cite exists.

Docs drift when the code moves under them: a file is split, a function renamed, a README
section moved to docs/. A reader who follows a stale reference loses trust in every other one,
so `make lint` fails on any. It reads README.md, CHANGELOG.md and docs/**/*.md, and reports,
as `file:line: what`, each:

- relative Markdown link whose file does not exist, or whose `#anchor` no heading of the
  target makes (GitHub's slugs);
- backticked repository path (`src/ledger/model/replay.rs`, `hack/images.sh`, `docs/protocol.md`)
  that does not exist; a path given relative to src/ (the module map's `controller/turn.rs`)
  that no file of the repository ends with;
- name the docs place in a file that the file does not contain: `src/controller/close.rs::end`,
  or, in a table cell, the backticked names after a path (the rule map's `src/fence/`
  `verdict`);
- section cited by name (docs/protocol.md, "The terminal claim") that no heading or bold
  lead-in of that doc starts with;
- page of docs/ a reader cannot reach from the README in two clicks (the README links the
  index, docs/README.md, which links every page).

It also reads the code, the chart and the scripts (src/, tests/, hack/, charts/, examples/,
benches/, exec/) for the docs they cite, a docs/ path and the section named after it, with the
same rules. Globs and placeholders (`tests/node_*.rs`, `<run>-<seq>`) are not paths and are left
alone, and so are fenced code blocks (commands, not references) and build outputs (`target/`,
`dist/`).

`hack/code-figures.py` reports the count as "docs references that do not resolve" (`problems`).
"""

import functools
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# The first components that make a backticked token a repository path, and the top-level files.
PATH_ROOTS = ("src", "tests", "hack", "docs", "charts", "examples", "benches", "exec", ".ci",
              "crds", "templates")
TOP_FILES = ("Makefile", "Cargo.toml", "Cargo.lock", "Dockerfile", "README.md", "CHANGELOG.md",
             "askama.toml")
CODE_DIRS = ("src", "tests", "hack", "charts", "examples", "benches", "exec")
SKIP_DIRS = {".git", "target", "node_modules", "dist", "__pycache__"}
# A shorthand path (relative to src/) is one token ending so; anything else is a word.
SHORTHAND = re.compile(r"^[\w.-]+(?:/[\w.-]+)*(?:\.(?:rs|py|sh|md|yaml|toml|mjs|json|html)|/)$")
PLACEHOLDER = re.compile(r"[*<>{}…$~]|\.\.\.")
NAME = re.compile(r"^[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*(?:\(\))?$")
# A section cited by name after a doc: docs/protocol.md, "The claim"; docs/protocol.md ("The
# claim"; a bare protocol.md beside the citing doc. In code the quote may go on after a comment
# marker on the next line (CONT).
CONT = r"(?:\s|//[/!]?|#(?!\w))*"
SECTION_CITE = re.compile(
    r"(?<![\w/.-])((?:docs/)?[\w./-]+\.md)\)?,?"
    + CONT
    + r"\(?\"((?:[^\"\n]|\n" + CONT + r"){1,90})\""
)
DOC_CITE = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w/]")


def repo_files():
    """Every file and directory of the repository, as paths from its root: what a reference may
    name. Built once; build outputs and vendored packages are not the repository's."""
    files, dirs = set(), set()
    for root, subdirs, names in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS]
        rel = os.path.relpath(root, ROOT).replace(os.sep, "/")
        if rel != ".":
            dirs.add(rel)
        for n in names:
            files.add(n if rel == "." else f"{rel}/{n}")
    return files, dirs


FILES, DIRS = repo_files()


@functools.cache
def read(rel):
    """A file's text (read once: the docs are read for every reference into them)."""
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def doc_files():
    """The docs this check holds true: the README, the changelog and everything in docs/."""
    return ["README.md", "CHANGELOG.md"] + sorted(f for f in FILES if f.startswith("docs/")
                                                  and f.endswith(".md"))


def prose_lines(text):
    """(line number, line) of a Markdown file outside its fenced code blocks: a command in a
    block is an example to run, not a reference to follow."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def whole_spans(lines):
    """The lines with the pieces of a code span that runs on to the next line left out: a span
    is read only when it opens and closes on one line, so a broken one never pairs its backtick
    with the next span's."""
    inside = False
    for n, line in lines:
        if not line.strip():
            inside = False
        elif inside:
            line, inside = (line.split("`", 1)[1], False) if "`" in line else ("", True)
        if line.count("`") % 2:
            line, inside = line.rsplit("`", 1)[0], True
        yield n, line


def slug(heading):
    """GitHub's anchor for a heading: its text without Markdown, lowercased, punctuation but
    `-` and `_` dropped, each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def sections(rel):
    """(anchors, titles) of a Markdown file: each heading's slug (a repeated one numbered as
    GitHub numbers it) and, for citations by name, every heading and bold lead-in's text."""
    anchors, titles, seen = set(), [], {}
    for _, line in prose_lines(read(rel)):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            anchors.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
            titles.append(plain(m.group(1)))
        for b in re.findall(r"(?:^|[-*\d.]\s+|^\s*)\*\*([^*]+)\*\*", line):
            titles.append(plain(b))
    return anchors, titles


def plain(text):
    """A title as a reader quotes it: no backticks, links or emphasis, lowercased."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[`*_]", "", text).strip().lower()


def section_problem(rel, name):
    """Why a section cited by name is not in `rel` (None when a heading or bold lead-in starts
    with it). A name is quoted as its start ("Owner writes" for "Owner writes: every...")."""
    if rel not in FILES:
        return f"{rel} does not exist"
    want = plain(re.sub(r"\s*(?://[/!]?|#)?\s*\n" + CONT, " ", name)).rstrip(".")
    if any(t.startswith(want) for t in sections(rel)[1]):
        return None
    return f'{rel} has no section "{name.strip()}"'


def link_problem(doc, target):
    """Why a relative link of `doc` does not resolve (None when it does)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
        return None  # a URL: another site's business
    path, _, anchor = target.partition("#")
    path = path.split("?")[0]
    rel = beside(doc, path) if path else doc
    if rel not in FILES and rel.rstrip("/") not in DIRS:
        return f"link to {target}: {rel} does not exist"
    if anchor and rel.endswith(".md") and anchor not in sections(rel)[0]:
        return f"link to {target}: no heading of {rel} makes #{anchor}"
    return None


def path_problem(token):
    """Why a backticked repository path does not exist (None when it does). `dir/` names a
    directory; `file::name` a name the file must contain."""
    path, _, name = token.partition("::")
    path = re.sub(r":\d+$", "", path)
    if path not in FILES and path.rstrip("/") not in DIRS:
        return f"`{token}`: {path} does not exist"
    return name_problem(path, name) if name else None


def name_problem(path, name):
    """Why `name` (its last `::` part: the item) is not in the file or directory `path`. A word
    search, not a parse: enough to catch a rule map row that points at the wrong file."""
    item = name.replace("()", "").split("::")[-1]
    rels = [path] if path in FILES else [f for f in FILES if f.startswith(path.rstrip("/") + "/")]
    word = re.compile(rf"\b{re.escape(item)}\b")
    if any(word.search(read(r)) for r in rels if r.endswith((".rs", ".py", ".sh", ".yaml"))):
        return None
    return f"`{name}` is not in {path}"


def repo_path(token):
    """The token as a path from the repository root if it names one by its first component
    (`src/..`, `./charts/..`, `Makefile`), else None."""
    token = token.strip(".,;:()'\"").removeprefix("./") if token != "." else token
    first = token.split("/")[0].split("::")[0]
    if "/" in token and first in PATH_ROOTS or first in TOP_FILES:
        return token
    return None


def span_problems(span, current):
    """Problems of one backticked span, and the path later names of its table cell belong to.
    `current` is the path a previous span of the cell named (None in prose)."""
    problems = []
    if PLACEHOLDER.search(span):
        return problems, current
    tokens = span.split()
    paths = [p for p in (repo_path(t) for t in tokens) if p]
    for p in paths:
        if problem := path_problem(p):
            problems.append(problem)
    if paths:
        return problems, paths[-1].partition("::")[0]
    if len(tokens) == 1 and SHORTHAND.match(span) and span.split("/")[0] not in SKIP_DIRS | {""}:
        if not any(f == span.rstrip("/") or f.endswith("/" + span.rstrip("/"))
                   for f in FILES | DIRS):
            problems.append(f"`{span}`: no file of the repository is {span}")
    elif current and NAME.match(span) and (problem := name_problem(current, span)):
        problems.append(problem)
    return problems, current


def line_problems(doc, line):
    """Every problem of one prose line of a doc: its links, its backticked paths (with the names
    that follow a path in a table cell), the sections it cites by name."""
    problems = []
    code_free = re.sub(r"`[^`]*`", "``", line)
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", code_free):
        if problem := link_problem(doc, target):
            problems.append(problem)
    cells = re.split(r"(?<!\\)\|", line) if line.lstrip().startswith("|") else [line]
    for cell in cells:
        current = None
        for span in re.findall(r"`([^`]+)`", cell):
            found, current = span_problems(span, current if cells != [line] else None)
            problems.extend(found)
    for target, name in SECTION_CITE.findall(line.replace("`", "")):
        rel = cited_doc(doc, target)
        if rel and (problem := section_problem(rel, name)):
            problems.append(problem)
    return problems


def cited_doc(doc, target):
    """The doc a section citation names: a docs/ path from the root, a bare name beside the
    citing doc. None for a top-level file (README.md: its sections are the front door's)."""
    if target.startswith("docs/"):
        return target
    if target in TOP_FILES:
        return None
    return beside(doc, target)


def beside(doc, target):
    """A path a doc gives relative to itself, as a path from the root."""
    return os.path.normpath(os.path.join(os.path.dirname(doc), target)).replace(os.sep, "/")


def doc_problems():
    """`file:line: problem` of every doc."""
    out = []
    for doc in doc_files():
        for n, line in whole_spans(prose_lines(read(doc))):
            out.extend(f"{doc}:{n}: {p}" for p in line_problems(doc, line))
    return out


def links_of(doc):
    """The docs a doc links to (relative Markdown links to a .md file), as paths from the root."""
    out = set()
    for _, line in prose_lines(read(doc)):
        code_free = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(([^)\s#]+\.md)(?:#[^)\s]*)?\)", code_free):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                out.add(beside(doc, target))
    return out


def unreachable_pages():
    """`page: problem` of every page of docs/ more than two clicks from the README: a newcomer
    finds any feature's page from the front door through the index, or not at all."""
    reached, edge = {"README.md"}, {"README.md"}
    for _ in range(2):
        edge = {t for d in edge if d in FILES for t in links_of(d)} - reached
        reached |= edge
    pages = [d for d in doc_files() if d.startswith("docs/")]
    return [f"{d}: not reachable from README.md in two clicks" for d in pages if d not in reached]


def code_files():
    """The files of the code, chart and scripts that may cite a doc (text files only)."""
    for rel in sorted(FILES):
        if rel.split("/")[0] in CODE_DIRS and not rel.endswith((".png", ".json", ".tgz")):
            yield rel


def code_problems():
    """`file:line: problem` of every doc the code cites (`docs/….md`, and the section named
    after it) that does not exist."""
    out = []
    for rel in code_files():
        text = read(rel)
        for m in DOC_CITE.finditer(text):
            where = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
            cited = m.group(0)
            if cited not in FILES and cited.rstrip("/") not in DIRS:
                out.append(f"{where}: cites {cited}, which does not exist")
        for m in SECTION_CITE.finditer(text):
            if m.group(1).startswith("docs/") and m.group(1) in FILES:
                if problem := section_problem(m.group(1), m.group(2)):
                    line = text.count("\n", 0, m.start()) + 1
                    out.append(f"{rel}:{line}: cites a section: {problem}")
    return out


def problems():
    """Every reference of the docs and the code that does not resolve."""
    return doc_problems() + code_problems() + unreachable_pages()


def main():
    found = problems()
    for p in found:
        print(p, file=sys.stderr)
    print(f"docs references that do not resolve: {len(found)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
