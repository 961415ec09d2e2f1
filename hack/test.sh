#!/usr/bin/env bash
# The project's test command (`make test`), from a fresh machine: installs what it needs
# (hack/setup.sh), checks generated files, runs the unit and integration tests against a local
# kube-apiserver + etcd, then the end-to-end tests on the real node (hack/node.sh: kubelet,
# containerd, the chart installed for real). Whatever it started, it stops; a node or control
# plane that was already up is left as found.
set -euo pipefail
cd "$(dirname "$0")/.."

bash hack/setup.sh
rc=0
# The upgrade lane's starting point (tests/node_upgrade.rs, tests/controller/versions.rs): the
# release hack/previous-release names, built from its commit (cached; the demo does not need
# it). Should it fail (a clone without that commit), the tests that need it fail saying so,
# and every other test still runs.
bash hack/images.sh previous || rc=$?

echo "==> checking generated files"
cargo run -q -- crd --dir crds --check
cargo run -q -- crd --dir charts/baton/crds --check

# The phase a test runs in is chosen by its test target (tests/<name>.rs or
# tests/<name>/main.rs): a target named node_* needs the real node and runs only there;
# every other target runs against the local control plane.
bed_targets=()
node_targets=()
for path in tests/*.rs tests/*/main.rs; do
  target=${path#tests/}
  target=${target%/main.rs}
  target=${target%.rs}
  if [[ $target == node_* ]]; then
    node_targets+=(--test "$target")
  else
    bed_targets+=(--test "$target")
  fi
done

# The worker tests run a real executor beside each worker process (testkit/src/common/worker_proc.rs).
cargo build -q -p baton-exec
echo "==> unit and integration tests against the local control plane"
# Benchmarks are not tests: they print figures (make bench-*). Every test binary runs even
# after one fails (--no-fail-fast). The node's targets run next, on the node.
bash hack/with-control-plane.sh cargo test --no-fail-fast --workspace --lib --bins "${bed_targets[@]}" -- "$@" || rc=$?

echo "==> end-to-end tests on the real node"
bash hack/with-node.sh cargo test --no-fail-fast "${node_targets[@]}" -- "$@" || rc=$?

echo "==> the node recovers from a run that was killed midway, and leaves nothing when stopped"
bash hack/node-recovery-test.sh || rc=$?
exit "$rc"
