#!/usr/bin/env bash
# `make bench-node`: the figures on the real node. Measures the node's warm start (down, then
# up from the cache), then runs benches/node_figures.rs against it, and stops the node.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
bash hack/node.sh down
t0=$(date +%s.%N)
bash hack/node.sh up
printf 'node figures: warm node start (binaries and images cached) -> Ready: %.1f s\n' \
  "$(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || python3 -c "print($(date +%s.%N) - $t0)")"
trap 'bash hack/node.sh down' EXIT
export BATON_NODE_DIR=${BATON_NODE_DIR:-/tmp/baton-node}
export BATON_NODE_KUBECONFIG=$BATON_NODE_DIR/kubeconfig
cargo bench --bench node_figures
