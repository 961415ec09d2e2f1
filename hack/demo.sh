#!/usr/bin/env bash
# `make demo`: one command from a fresh clone. Builds baton, starts a local kube-apiserver +
# etcd, the controller and the local pod runner, applies examples/demo.yaml, kills the worker
# with SIGKILL in the middle of the run, and shows the run resume in a new pod and succeed —
# as `kubectl get agentruns -w` shows it — then its transcript. Leaves nothing running when it
# ends, or on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [[ -z ${BATON_LOCAL_CONTROL_PLANE:-} ]]; then
  # Run under the control plane wrapper: it starts a local kube-apiserver + etcd (the first
  # time it builds kube-apiserver: ~6 min) and stops it after the demo if it started it. The
  # demo never touches the cluster your own KUBECONFIG names.
  exec bash hack/with-control-plane.sh bash hack/demo.sh
fi

# A namespace of its own each time: the local control plane runs no garbage collector, so a
# previous demo's pods, Lease and ledger would still be there under the same names.
ns=baton-demo-$(date +%s)
run=demo
work=$(mktemp -d "${TMPDIR:-/tmp}/baton-demo.XXXXXX")
effects=$work/baton-demo-effects.log   # the tools write here: the runner gives every pod BATON_DEMO_EFFECTS
runner_addr=127.0.0.1:7391
admin_addr=127.0.0.1:8089
pids=()

command -v kubectl >/dev/null 2>&1 || {
  echo "the demo shows the run with kubectl, which is not installed: apt-get install kubernetes-client" >&2
  exit 1
}

say() { printf '\n\033[1;36m==> %s\033[0m\n' "$*"; }

cleanup() {
  local rc=$?
  say "cleaning up"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "logs were in $work (removed)"; rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "building baton (the first build takes a few minutes)"
cargo build --bins
baton=$root/target/debug/baton
runner=$root/target/debug/baton-runner
[[ -x $baton && -x $runner ]] || { echo "build failed"; exit 1; }

k() { kubectl --request-timeout=10s "$@" 2>/dev/null; }

say "installing the CRDs"
"$baton" crd --apply
k create namespace "$ns" >/dev/null || true

say "starting the controller and the local pod runner"
"$baton" controller --leader-election=false --namespace "$ns" --admin-addr "$admin_addr" \
  >"$work/controller.log" 2>&1 &
pids+=($!)
"$runner" run --namespace "$ns" --control-addr "$runner_addr" --log-dir "$work/pods" \
  --env "BATON_DEMO_EFFECTS=$effects" \
  >"$work/runner.log" 2>&1 &
pids+=($!)

say "applying examples/demo.yaml and watching (kubectl get agentruns -w)"
k -n "$ns" apply -f examples/demo.yaml >/dev/null
kubectl -n "$ns" get agentruns -w 2>/dev/null &
pids+=($!)

steps() { k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.steps}'; }
worker() { k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.worker}'; }
for _ in $(seq 1 240); do
  [[ "$(steps)" -ge 2 ]] 2>/dev/null && break
  sleep 0.5
done
victim=$(worker)
sleep 1
say "kill -9 of worker pod $victim in the middle of the run"
"$runner" ctl --addr "$runner_addr" kill "$ns/$victim"

if ! kubectl -n "$ns" wait --for=jsonpath='{.status.phase}'=Succeeded "agentrun/$run" --timeout=180s >/dev/null 2>&1; then
  say "the run did not succeed in time; controller log:"
  tail -20 "$work/controller.log"
  exit 1
fi
sleep 1
kill "${pids[2]}" 2>/dev/null || true

say "the run after the crash"
k -n "$ns" get agentrun "$run" -o \
  'custom-columns=PHASE:.status.phase,ATTEMPT:.status.attempt,FENCE:.status.fence,FAILED:.status.failedAttempts,STEPS:.status.steps,UNKNOWN:.status.unknownEffectCount'
k -n "$ns" get agentrun "$run" -o 'jsonpath={range .status.unknownEffects[*]}unknown effect: step {.step} ({.tool}, attempt {.attempt}): {.resolution}{"\n"}{end}'
echo "output: $(k -n "$ns" get agentrun "$run" -o 'jsonpath={.status.output}')"

say "side effects, as the tool recorded them (no step ran twice)"
cat "$effects" || { echo "no side effects were recorded in $effects"; exit 1; }
# The demo checks its own claim: no step's effect is recorded twice (the killed step's effect
# is reported unknown, never re-run).
twice=$(sed -n 's/.*step \([0-9]*\)).*/\1/p' "$effects" | sort | uniq -d)
[[ -z $twice ]] || { echo "a side effect ran twice (step $twice)"; exit 1; }

say "the transcript, from the ledger"
"$baton" transcript "$run" -n "$ns" || true
