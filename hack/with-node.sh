#!/usr/bin/env bash
# Runs a command with BATON_NODE_KUBECONFIG (and BATON_NODE_DIR) set for the real node. Starts
# the node if it is not up, and stops it afterwards only in that case. The node gets the
# images of the cache (hack/images.sh) at start; an already-running one is given them again.
set -euo pipefail
cd "$(dirname "$0")/.."

started_here=0
stop_node() {
  if [[ $started_here == 1 ]]; then bash hack/node.sh down || true; fi
}
trap stop_node EXIT

if bash hack/node.sh status >/dev/null 2>&1; then
  bash hack/node.sh import "${BATON_CACHE_DIR:-$HOME/.cache/baton}"/images/*.oci.tar
else
  started_here=1
  echo "==> starting the node"
  bash hack/node.sh up
fi
export BATON_NODE_DIR=${BATON_NODE_DIR:-/tmp/baton-node}
export BATON_NODE_KUBECONFIG=$BATON_NODE_DIR/kubeconfig
echo "==> BATON_NODE_KUBECONFIG=$BATON_NODE_KUBECONFIG"
"$@"
