#!/usr/bin/env bash
# hack/lint-shell.sh — the project's shell scripts held to shellcheck (Debian's `shellcheck`,
# installed here when missing: `make lint` runs before `make demo` installs anything else).
# Every warning and note fails; a deliberate exception carries a `# shellcheck disable=` with
# its reason beside it. No function in hack/*.sh may be longer than 60 lines, from its
# `name() {` line to its closing `}` inclusive: a longer one fails, named with its length.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_TAG=lint-shell
CACHE_DIR=${BATON_CACHE_DIR:-$HOME/.cache/baton}
# shellcheck source=hack/lib.sh
source hack/lib.sh
readonly MAX_FUNCTION_LINES=60

ensure_tool shellcheck shellcheck
shellcheck --external-sources hack/*.sh .ci/run

# A function opens with `name() {` and closes at the first `}` at the start of a line indented
# as its opening line was (a nested one closes at its own indentation). One-liners, `name() {
# ...; }`, are one line. An opening with no such close fails too, so that none goes unmeasured.
awk -v max="$MAX_FUNCTION_LINES" '
  function unclosed() {
    if (n) { printf "%s:%d: function %s has no closing } at its own indentation\n", file, start[n], name[n]; bad = 1 }
    n = 0
  }
  FNR == 1 { unclosed(); file = FILENAME }
  /^[[:space:]]*[[:alnum:]_:.-]+\(\)[[:space:]]*\{/ {
    code = $0; sub(/[[:space:]]+#.*$/, "", code)
    if (code ~ /\}$/) next
    n++; start[n] = FNR
    indent[n] = $0; sub(/[^[:space:]].*/, "", indent[n])
    name[n] = $0; sub(/^[[:space:]]*/, "", name[n]); sub(/\(.*/, "", name[n])
    next
  }
  n && $0 ~ ("^" indent[n] "}([[:space:]]|$)") {
    if (FNR - start[n] + 1 > max) {
      printf "%s:%d: function %s is %d lines long (at most %d)\n", file, start[n], name[n], FNR - start[n] + 1, max
      bad = 1
    }
    n--
  }
  END { unclosed(); exit bad }
' hack/*.sh || die "shell functions over $MAX_FUNCTION_LINES lines or unmeasured (above): split them"
