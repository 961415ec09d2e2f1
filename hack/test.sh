#!/usr/bin/env bash
# The project's test command (`make test`): checks generated files, runs the unit tests, then
# starts a real local kube-apiserver + etcd and runs every test against it. The control plane
# is stopped on exit unless it was already up (then it is left as found).
set -euo pipefail
cd "$(dirname "$0")/.."

cp=hack/control-plane.sh
started_here=0
stop_control_plane() {
  if [[ $started_here == 1 ]]; then bash "$cp" down || true; fi
}
trap stop_control_plane EXIT

echo "==> checking generated files"
cargo run -q -- crd --dir crds --check
cargo run -q -- crd --dir charts/baton/crds --check

if ! bash "$cp" status >/dev/null 2>&1; then
  started_here=1
  echo "==> starting the local control plane"
  bash "$cp" up
fi
eval "$(bash "$cp" env)"
echo "==> KUBECONFIG=$KUBECONFIG"

echo "==> running all tests against the local control plane"
cargo test --all-targets -- "$@"
