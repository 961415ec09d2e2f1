#!/usr/bin/env bash
# The node's own test (run by `make test` after the node's scenarios): a node whose session was
# killed midway — every daemon SIGKILLed, its containers and shims left running, its mounts,
# network namespace, cgroups and PID files left behind — is cleaned up by the next `up`, which
# comes up Ready; `down` then leaves nothing (it checks, and fails otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
state=${BATON_NODE_DIR:-/tmp/baton-node}
pass=0 fail=0
check() { # WHAT COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; pass=$((pass + 1)); else echo "FAILED: $what"; fail=$((fail + 1)); fi
}

was_up=0
bash hack/node.sh status >/dev/null 2>&1 && was_up=1
bash hack/node.sh up >/dev/null
export KUBECONFIG=$state/kubeconfig
kubectl apply -f - >/dev/null 2>&1 <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: left-running, namespace: default}
spec:
  automountServiceAccountToken: false
  containers: [{name: c, image: registry.k8s.io/pause:3.2, imagePullPolicy: Never}]
YAML
kubectl wait --for=condition=Ready pod/left-running --timeout=60s >/dev/null 2>&1
shim=$(pgrep -f -- "-address $state/containerd/containerd.sock" | head -1 || true)
check "a container runs before the kill" test -n "$shim"

# The session dies: every daemon is killed at once, nothing of the node is cleaned up.
for f in "$state"/*.pid; do kill -KILL "$(<"$f")" 2>/dev/null || true; done
sleep 1
check "its shim outlives the daemons" kill -0 "$shim"

out=$(bash hack/node.sh up 2>&1) || { echo "$out"; false; }
check "up cleans up the killed node" grep -q "cleaning up an earlier node" <<<"$out"
check "the killed node's shim is gone" bash -c "! kill -0 $shim 2>/dev/null"
check "the node is Ready again" bash hack/node.sh status
check "down leaves nothing behind" bash hack/node.sh down
# A node that was up before this test is up again after it.
[[ $was_up -eq 0 ]] || bash hack/node.sh up >/dev/null
echo "node recovery: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
