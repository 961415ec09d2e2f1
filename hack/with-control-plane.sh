#!/usr/bin/env bash
# Runs a command with KUBECONFIG pointing at the local control plane. Starts the control plane
# if it is not up, and stops it afterwards only in that case (an already-running one is left
# as found).
set -euo pipefail
cd "$(dirname "$0")/.."

cp=hack/control-plane.sh
started_here=0
stop_control_plane() {
  if [[ $started_here == 1 ]]; then bash "$cp" down || true; fi
}
trap stop_control_plane EXIT

if ! bash "$cp" status >/dev/null 2>&1; then
  started_here=1
  echo "==> starting the local control plane"
  bash "$cp" up
fi
eval "$(bash "$cp" env)"
echo "==> KUBECONFIG=$KUBECONFIG"
"$@"
