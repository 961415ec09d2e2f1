#!/usr/bin/env bash
# The project's test command (`make test`), from a fresh machine: installs what it needs
# (hack/setup.sh), checks generated files, runs the unit and integration tests against a local
# kube-apiserver + etcd, then the end-to-end tests on the real node (hack/node.sh: kubelet,
# containerd, the chart installed for real). Whatever it started, it stops; a node or control
# plane that was already up is left as found.
set -euo pipefail
cd "$(dirname "$0")/.."

bash hack/setup.sh

echo "==> checking generated files"
cargo run -q -- crd --dir crds --check
cargo run -q -- crd --dir charts/baton/crds --check

rc=0
# The worker tests run a real executor beside each worker process (tests/common/worker_proc.rs).
cargo build -q -p baton-exec
echo "==> unit and integration tests against the local control plane"
# Benchmarks are not tests: they print figures (make bench-*). Every test binary runs even
# after one fails (--no-fail-fast). The node's scenarios run next, on the node.
bash hack/with-control-plane.sh cargo test --no-fail-fast --workspace --lib --bins --tests -- --skip node_ "$@" || rc=$?

echo "==> end-to-end tests on the real node"
# Every test named node_* (tests/node_e2e.rs, tests/node_chaos.rs) runs here and only here.
bash hack/with-node.sh cargo test --no-fail-fast --tests -- node_ "$@" || rc=$?

echo "==> the node recovers from a run that was killed midway, and leaves nothing when stopped"
bash hack/node-recovery-test.sh || rc=$?
exit "$rc"
