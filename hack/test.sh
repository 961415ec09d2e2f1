#!/usr/bin/env bash
# The project's test command (`make test`): checks generated files, then runs the unit,
# integration and end-to-end tests against a real local kube-apiserver + etcd
# (hack/with-control-plane.sh starts it, and stops it afterwards if it was not already up).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> checking generated files"
cargo run -q -- crd --dir crds --check
cargo run -q -- crd --dir charts/baton/crds --check

echo "==> running all tests against the local control plane"
# Benchmarks are not tests: they print figures (make bench-*) and are not run here. Every test
# binary runs even after one fails (--no-fail-fast): one CI run shows every failure.
bash hack/with-control-plane.sh cargo test --no-fail-fast --lib --bins --tests -- "$@"
