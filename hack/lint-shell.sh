#!/usr/bin/env bash
# hack/lint-shell.sh — the project's shell scripts held to shellcheck (Debian's `shellcheck`,
# installed here when missing: `make lint` runs before `make demo` installs anything else).
# Every warning and note fails; a deliberate exception carries a `# shellcheck disable=` with
# its reason beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_TAG=lint-shell
CACHE_DIR=${BATON_CACHE_DIR:-$HOME/.cache/baton}
# shellcheck source=hack/lib.sh
source hack/lib.sh

ensure_tool shellcheck shellcheck
shellcheck --external-sources hack/*.sh .ci/run
