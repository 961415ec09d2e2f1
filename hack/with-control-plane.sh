#!/usr/bin/env bash
# Runs a command against the bed: KUBECONFIG pointing at the local control plane and
# BATON_TEST_POSTGRES_URL at a throwaway PostgreSQL (hack/postgres.sh). Starts each if it is
# not up, and stops afterwards only what it started (one already running is left as found).
set -euo pipefail
cd "$(dirname "$0")/.."

cp=hack/control-plane.sh
pg=hack/postgres.sh
cp_started=0
pg_started=0
stop_bed() {
  if [[ $pg_started == 1 ]]; then bash "$pg" down || true; fi
  if [[ $cp_started == 1 ]]; then bash "$cp" down || true; fi
}
trap stop_bed EXIT

if ! bash "$cp" status >/dev/null 2>&1; then
  cp_started=1
  echo "==> starting the local control plane"
  bash "$cp" up
fi
if ! bash "$pg" status >/dev/null 2>&1; then
  pg_started=1
  echo "==> starting PostgreSQL"
  bash "$pg" up
fi
eval "$(bash "$cp" env)"
eval "$(bash "$pg" env)"
echo "==> KUBECONFIG=$KUBECONFIG"
"$@"
