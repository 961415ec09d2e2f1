#!/usr/bin/env bash
# hack/lint-fence.sh — every fence rule lives in src/fence/ (docs/protocol.md): no other
# source file compares fences by hand. A comparison operator next to an operand named
# `fence` (`fence`, `s.fence`, `*fence`, `Some(fence)`, `fence.get()`, `spec.fence`) is one;
# comments, string literals and unit-test files are not looked at, nor src/fence/ itself,
# nor src/cli/describe.rs, which groups the ledger's events by
# attempt for display and decides nothing. Prints each one found and fails; prints nothing
# when clean. The rule has one copy, in hack/code-figures.py (`--fence` here), which also
# counts it among the figures of `make code-figures`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 hack/code-figures.py --fence
