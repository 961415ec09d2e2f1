#!/usr/bin/env bash
# hack/lint-fence.sh — every fence rule lives in src/fence.rs (docs/protocol.md): no other
# source file compares fences by hand. A comparison operator next to an operand named
# `fence` (`fence`, `s.fence`, `*fence`, `Some(fence)`, `fence.get()`, `spec.fence`) is one;
# comments and unit-test files are not looked at, nor src/cli/describe.rs, which groups the
# ledger's events by attempt for display and decides nothing. Prints each one found and
# fails; prints nothing when clean.
set -euo pipefail
cd "$(dirname "$0")/.."

operand='[*&]?([A-Za-z_][A-Za-z0-9_]*\.)*fence(\(\))?(\.get\(\))?'
left="\\b${operand#\[\*&\]\?}[[:space:]]*(==|!=|<=|>=|<[^<=]|>[^>=])"
right="(==|!=|<=|>=|[^-=<]<[[:space:]]|[^-=>]>[[:space:]])[[:space:]]*(Some\\()?${operand}\\b"

found=$(grep -rnE --include='*.rs' "$left|$right" src \
  | grep -vE '^src/(fence(_tests)?|cli/describe)\.rs:' \
  | grep -vE '^[^:]+_tests\.rs:' \
  | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
if [[ -n $found ]]; then
  echo "fence compared outside src/fence.rs (use its rules: lease_reached, lease_held, status_names, superseded, follows, may_append_at, Fence::is_first/never_claimed):" >&2
  echo "$found" >&2
  exit 1
fi
