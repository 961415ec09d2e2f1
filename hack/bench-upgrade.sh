#!/usr/bin/env bash
# `make bench-upgrade`: figures of an upgrade from the previous release (hack/previous-release)
# with runs in flight, on the real node (benches/upgrade_figures.rs; BATON_UPGRADE_RUNS runs,
# default 200). Installs what it needs, builds the previous release's image (cached), and starts
# the node unless one is up (hack/with-node.sh stops what it started).
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
bash hack/images.sh previous
bash hack/with-node.sh cargo bench --bench upgrade_figures
