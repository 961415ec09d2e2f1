#!/usr/bin/env bash
# The node's own test (run by `make test` after the node's scenarios): a node whose session was
# killed midway — every daemon SIGKILLed, its containers and shims left running, its mounts,
# network namespace, cgroups and PID files left behind — is cleaned up by the next `up`, which
# comes up Ready. Then `down`'s leftover check, both ways: it names a trace of the node's own
# left in the root namespace (a route to the pods' range), and it ignores another program's
# interface that appears or changes meanwhile (as podman's CNI bridge does).
set -euo pipefail
cd "$(dirname "$0")/.."
state=${BATON_NODE_DIR:-/tmp/baton-node}
pass=0 fail=0
check() { # WHAT COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; pass=$((pass + 1)); else echo "FAILED: $what"; fail=$((fail + 1)); fi
}
readonly POD_CIDR=10.78.0.0/24      # hack/node.sh's pod range
readonly OTHER_LINK=other-br0       # another program's bridge; TEST-NET-1, no port: nothing leaves
readonly OTHER_ADDR=192.0.2.1/24
undo() {
  ip route del blackhole "$POD_CIDR" 2>/dev/null || true
  ip link del "$OTHER_LINK" 2>/dev/null || true
}
trap undo EXIT

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

# A trace of the node's own in the root namespace (as a leaked route would be): `down` fails
# and names it.
ip route add blackhole "$POD_CIDR"
down_out=$(bash hack/node.sh down 2>&1) && down_rc=0 || down_rc=$?
check "down fails on a route of the node's left behind" test "$down_rc" -ne 0
check "and names it" grep -q "root namespace changed: .*blackhole $POD_CIDR" <<<"$down_out"
ip route del blackhole "$POD_CIDR"

# Another program's interface appears, with an address and a route, while the node is up.
bash hack/node.sh up >/dev/null
ip link add "$OTHER_LINK" type bridge
ip addr add "$OTHER_ADDR" dev "$OTHER_LINK"
ip link set "$OTHER_LINK" up
check "down leaves nothing behind, another program's interface changed meanwhile" bash hack/node.sh down
undo
# A node that was up before this test is up again after it.
[[ $was_up -eq 0 ]] || bash hack/node.sh up >/dev/null
echo "node recovery: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
