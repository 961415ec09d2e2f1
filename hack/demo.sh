#!/usr/bin/env bash
# `make demo`: one command from a fresh clone. Installs what it needs (hack/setup.sh), starts
# the real node (hack/node.sh: kubelet, containerd), installs baton with its chart, applies
# examples/demo.yaml, kills the worker container's process with SIGKILL from the host in the
# middle of the run, and shows the run resume in a new pod and succeed — as `kubectl get
# agentruns -w` shows it — then its transcript. It fails if the run does not succeed or a side
# effect ran twice. Leaves nothing running when it ends, or on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z ${BATON_NODE_KUBECONFIG:-} ]]; then
  bash hack/setup.sh
  # Under the node wrapper: it starts the node and stops it after the demo if it started it.
  # The demo never touches the cluster your own KUBECONFIG names.
  exec bash hack/with-node.sh bash hack/demo.sh
fi
export KUBECONFIG=$BATON_NODE_KUBECONFIG
ns=baton-demo-$(date +%s)
run=demo
work=$(mktemp -d "${TMPDIR:-/tmp}/baton-demo.XXXXXX")
effects=$work/effects.log
effects_addr=10.77.0.1:7391   # inside the node's network namespace: the pods reach it
pids=()

say() { printf '\n\033[1;36m==> %s\033[0m\n' "$*"; }
k() { kubectl --request-timeout=10s "$@" 2>/dev/null; }

cleanup() {
  local rc=$?
  say "cleaning up"
  k delete namespace "$ns" --wait=false >/dev/null || true
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "installing baton with its chart (image baton:dev, built from the Dockerfile by hack/images.sh)"
# The webhook reads only the API server: the CA of the client certificate hack/node.sh gives it.
client_ca=${BATON_NODE_DIR:-/tmp/baton-node}/pki/webhook-client-ca.crt
values=$(python3 -c 'import json, sys; print(json.dumps({"webhook": {"clientCA": open(sys.argv[1]).read()}}))' "$client_ca")
if ! k -n baton-system get deployment baton-controller >/dev/null; then
  python3 hack/helm.py install charts/baton --name baton --namespace baton-system --create-namespace \
    --values "$values" >/dev/null
fi
k -n baton-system rollout status deployment/baton-controller --timeout=180s
k create namespace "$ns" >/dev/null

# The effects of the demo's tools, counted outside baton: examples/demo.yaml appends each
# step's line to a file in its pod; here that line goes to hack/effects.py on the node instead
# (pods are gone after the run, and with them their files).
nsenter --net=/run/netns/baton-node python3 hack/effects.py "$effects_addr" "$effects" >/dev/null &
pids+=($!)
python3 - "$effects_addr" examples/demo.yaml >"$work/demo.yaml" <<'PY'
import sys
host, port = sys.argv[1].split(":")
text = open(sys.argv[2]).read()
print(text.replace(">> /tmp/baton-demo-effects.log",
                   f"| bash -c 'cat > /dev/tcp/{host}/{port}'"), end="")
PY
grep -q "/dev/tcp/" "$work/demo.yaml" || { echo "could not point examples/demo.yaml at the effects server"; exit 1; }

say "applying examples/demo.yaml and watching (kubectl get agentruns -w)"
# stderr shown: a refusal here says why (the API server names the field or the webhook).
kubectl --request-timeout=10s -n "$ns" apply -f "$work/demo.yaml" >/dev/null
kubectl -n "$ns" get agentruns -w 2>/dev/null &
pids+=($!)

steps() { k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.steps}'; }
worker() { k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.worker}'; }
container_pid() { # the host PID of the worker container, as containerd's shim recorded it
  local id
  id=$(k -n "$ns" get pod "$1" -o 'jsonpath={.status.containerStatuses[?(@.name=="worker")].containerID}')
  cat "${BATON_NODE_DIR:-/tmp/baton-node}/containerd/state/io.containerd.runtime.v2.task/k8s.io/${id#containerd://}/init.pid" 2>/dev/null
}
for _ in $(seq 1 240); do
  [[ "$(steps)" -ge 2 ]] 2>/dev/null && break
  sleep 0.5
done
victim=$(worker)
pid=$(container_pid "$victim") || { echo "no running worker container for $victim"; exit 1; }
sleep 1
say "kill -9 of the worker process of pod $victim (host PID $pid) in the middle of the run"
kill -KILL "$pid"

if ! kubectl -n "$ns" wait --for=condition=Complete "agentrun/$run" --timeout=240s >/dev/null 2>&1 \
  || [[ $(k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.phase}') != Succeeded ]]; then
  say "the run did not succeed in time; controller log:"
  k -n baton-system logs deployment/baton-controller --tail=20 || true
  exit 1
fi
sleep 1
kill "${pids[1]}" 2>/dev/null || true

say "the run after the crash"
k -n "$ns" get agentrun "$run" -o \
  'custom-columns=PHASE:.status.phase,ATTEMPT:.status.attempt,FENCE:.status.fence,FAILED:.status.failedAttempts,STEPS:.status.steps,UNKNOWN:.status.unknownEffectCount'
k -n "$ns" get agentrun "$run" -o 'jsonpath={range .status.unknownEffects[*]}unknown effect: step {.step} ({.tool}, attempt {.attempt}): {.resolution}{"\n"}{end}'
echo "output: $(k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.output}')"
[[ $(k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.failedAttempts}') -ge 1 ]] \
  || { echo "the worker was killed, yet no attempt died"; exit 1; }

say "side effects, as the tools recorded them (no step ran twice)"
[[ -s $effects ]] || { echo "no side effects were recorded"; exit 1; }
cat "$effects"
twice=$(sed -n 's/.*step \([0-9]*\)).*/\1/p' "$effects" | sort | uniq -d)
[[ -z $twice ]] || { echo "a side effect ran twice (step $twice)"; exit 1; }

say "the transcript, from the ledger (baton transcript)"
# The binary hack/images.sh built for baton's image (setup ran it): nothing compiles here.
baton=target/image/baton
[[ -x $baton ]] || { echo "no $baton: hack/images.sh baton builds it"; exit 1; }
"$baton" transcript "$run" -n "$ns"
