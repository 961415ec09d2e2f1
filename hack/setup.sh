#!/usr/bin/env bash
# hack/setup.sh — everything `make test` and `make demo` need on a fresh Debian machine, each
# step skipped when already there: system packages, kubectl, the Helm SDK and the MCP SDK
# (the tests' MCP server) from PyPI, Debian's chromium and npm's playwright-core (the
# console's browser tests), Debian's PostgreSQL (the PostgreSQL ledger's tests), the
# node's packages and server binaries (built once from Debian's kubernetes source and cached),
# and the images (pause, a Debian base, baton's own from the Dockerfile). Progress is shown.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> setup: %s\n' "$*"; }
export DEBIAN_FRONTEND=noninteractive
LOG_TAG=setup
CACHE_DIR=${BATON_CACHE_DIR:-$HOME/.cache/baton}
# shellcheck source=hack/lib.sh
source hack/lib.sh

step "package sources (the machine's own apt configuration)"
archive=$(debian_archive_uri)
echo "Debian archive: $archive"

step "system packages"
need=()
# busybox-static: the plain tools image of the node's tests (hack/images.sh busybox); file
# checks that it is static.
for pkg in make openssl curl busybox-static file; do pkg_installed "$pkg" || need+=("$pkg"); done
# kubectl: the tests drive `kubectl drain`, `rollout`, `wait`, `auth can-i` and the kubectl
# plugin. Debian's kubernetes-client (1.20) matches the node when the machine has none.
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
if ((${#need[@]})); then apt_install "${need[@]}"; fi
kubectl version --client 2>/dev/null | head -1 || true

step "Helm SDK (PyPI's helm-python-sdk: Helm's Go SDK, no helm binary)"
python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
if ! python3 -c 'import helm_python' 2>/dev/null; then
  pip_install() { python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$@"; }
  # A Debian-managed python3 refuses plain installs (PEP 668).
  pip_install helm-python-sdk==0.2.2 || pip_install --break-system-packages helm-python-sdk==0.2.2
fi
python3 -c 'import helm_python; print("helm SDK", helm_python.helm_sdk_version())'

step "an MCP server for the tests: PyPI's mcp (the official Python SDK), in a venv of its own"
# tests/mcp/server.py runs with it; the worker tests find it at this path (BATON_MCP_PYTHON).
mcp_venv=${BATON_CACHE_DIR:-$HOME/.cache/baton}/mcp-venv
if ! "$mcp_venv/bin/python" -c 'import mcp.server' 2>/dev/null; then
  rm -rf "$mcp_venv"
  # Debian's python3 makes venvs only with python3-venv.
  python3 -m venv "$mcp_venv" 2>/dev/null || {
    rm -rf "$mcp_venv"
    apt_install python3-venv
    python3 -m venv "$mcp_venv"
  }
  "$mcp_venv/bin/python" -m pip install --quiet --disable-pip-version-check mcp==2.3.0
fi
"$mcp_venv/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"))'

step "a model server nobody here wrote, for the providers' tests: PyPI's litellm[proxy], in a venv of its own"
# testkit/src/common/litellm.rs starts it on loopback with the mock models of tests/litellm/config.yaml.
# 1.108.7: the newest release whose proxy extra resolves from PyPI (1.108.8 to 1.110.x pin
# litellm-proxy, litellm-proxy-extras or litellm-enterprise builds never published there).
litellm_venv=${BATON_CACHE_DIR:-$HOME/.cache/baton}/litellm-venv
litellm_version=1.108.7
if ! "$litellm_venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$litellm_version')" 2>/dev/null \
  || [[ ! -x $litellm_venv/bin/litellm ]]; then
  rm -rf "$litellm_venv"
  python3 -m venv "$litellm_venv"
  "$litellm_venv/bin/python" -m pip install --quiet --disable-pip-version-check "litellm[proxy]==$litellm_version"
fi
"$litellm_venv/bin/python" -c 'import importlib.metadata as m; print("litellm", m.version("litellm"))'

# A venv of the cache (`$1`) with the pins of requirements file `$2`, rebuilt when the pins
# change (a hash of the file beside it).
venv_of_requirements() {
  local venv=${BATON_CACHE_DIR:-$HOME/.cache/baton}/$1 sum
  sum=$(sha256sum "$2" | cut -d' ' -f1)
  if [[ $(cat "$venv/requirements.sha256" 2>/dev/null) != "$sum" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$2"
    echo "$sum" >"$venv/requirements.sha256"
  fi
}

step "the agent frameworks of tests/agents/requirements.txt (PyPI), in a venv of their own"
# The worker tests run the example agents of tests/agents/ with it, the same pins as the agent
# image (hack/images.sh agents); rebuilt when the pins change (a hash of the file beside it).
venv_of_requirements agents-venv tests/agents/requirements.txt
agents_venv=${BATON_CACHE_DIR:-$HOME/.cache/baton}/agents-venv
"$agents_venv/bin/python" -c 'import importlib.metadata as m; print("openai-agents", m.version("openai-agents"))'

step "the stock protocol clients of tests/clients/requirements.txt (PyPI), in a venv of their own"
# The server's Responses and A2A tests drive baton with the official openai and a2a-sdk clients;
# rebuilt when the pins change (a hash of the file beside it).
venv_of_requirements clients-venv tests/clients/requirements.txt
clients_venv=${BATON_CACHE_DIR:-$HOME/.cache/baton}/clients-venv
"$clients_venv/bin/python" -c 'import importlib.metadata as m; print("a2a-sdk", m.version("a2a-sdk"), "openai", m.version("openai"))'

step "a real trace backend: Arize Phoenix of tests/phoenix/requirements.txt (PyPI), in a venv of its own"
# The trace tests export baton's spans over OTLP to it and read them back through its API;
# rebuilt when the pin changes (a hash of the file beside it).
venv_of_requirements phoenix-venv tests/phoenix/requirements.txt
phoenix_venv=${BATON_CACHE_DIR:-$HOME/.cache/baton}/phoenix-venv
"$phoenix_venv/bin/python" -c 'import importlib.metadata as m; print("arize-phoenix", m.version("arize-phoenix"))'

step "a real browser for the console's tests: Debian's chromium, driven by npm's playwright-core"
# Playwright's own browser download cannot work here: its npm package is installed without
# one, and the tests launch /usr/bin/chromium (tests/browser/console.mjs).
need=()
pkg_installed chromium || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if ((${#need[@]})); then apt_install "${need[@]}"; fi
if [[ ! -f tests/browser/node_modules/playwright-core/package.json ]]; then
  (cd tests/browser && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi
echo "chromium $(/usr/bin/chromium --version 2>/dev/null | awk '{print $2}'), playwright-core $(node -p 'require("./tests/browser/node_modules/playwright-core/package.json").version')"

step "a real PostgreSQL for the PostgreSQL ledger's tests: Debian's postgresql-15"
# hack/postgres.sh runs its own throwaway cluster from these binaries; whatever cluster the
# package itself sets up is never started or used.
pg_ctl=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/pg_ctl' 2>/dev/null | sort -V | tail -1)
[[ -n $pg_ctl ]] || apt_install postgresql-15
"$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/postgres' | sort -V | tail -1)" --version

step "the API server for the integration tests (built once, cached)"
bash hack/control-plane.sh install

step "the node: containerd, runc, CNI, podman, mmdebstrap; kubelet and the rest (built once, cached)"
bash hack/node.sh install

step "images: pause, Debian base (mmdebstrap), baton (the Dockerfile's prebuilt stage), busybox, agents (tests/agents)"
bash hack/images.sh all
