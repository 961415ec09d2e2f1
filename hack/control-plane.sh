#!/usr/bin/env bash
# hack/control-plane.sh — a real kube-apiserver + etcd on loopback, for baton's
# integration and end-to-end tests. No cluster, no Docker needed.
#
#   hack/control-plane.sh install   make sure kube-apiserver and etcd exist (builds once)
#   hack/control-plane.sh up        install if needed, start etcd + kube-apiserver, wait for /readyz
#   hack/control-plane.sh down      stop exactly the processes `up` started, remove the state dir
#   hack/control-plane.sh status    say whether it is up (exit 0 if up and ready, 1 otherwise)
#   hack/control-plane.sh env       print `export KUBECONFIG=...` (and BATON_WEBHOOK_CLIENT_CA) for: eval "$(hack/control-plane.sh env)"
#   hack/control-plane.sh pause-apiserver / resume-apiserver
#                                   SIGSTOP / SIGCONT only the kube-apiserver (an unreachable server;
#                                   the end-to-end test runs it on its own BATON_CP_DIR instance)
#
# Binaries, first match wins:
#   1. envtest convention: $TEST_ASSET_KUBE_APISERVER / $TEST_ASSET_ETCD, or $KUBEBUILDER_ASSETS/{kube-apiserver,etcd}
#   2. `kube-apiserver` / `etcd` on PATH, or in the cache ($BATON_CACHE_DIR/k8s-1.20/)
#   3. Debian: etcd from the `etcd-server` package (its service is never started or used);
#      the server binaries (kube-apiserver and, for hack/node.sh, the other four) built once (~4-7 min) from Debian's `kubernetes` source package into the cache.
#
# Environment:
#   BATON_CP_DIR            state dir (pids, certs, logs, etcd data, kubeconfig)
#                           default: ${TMPDIR:-/tmp}/baton-control-plane
#   BATON_CACHE_DIR         binary/build cache, default: $HOME/.cache/baton
#   BATON_CP_API_PORT       kube-apiserver secure port (default 6443)
#   BATON_CP_ETCD_PORT      etcd client port (default 2379)
#   BATON_CP_ETCD_PEER_PORT etcd peer port (default 2380)
#                           A port set explicitly must be free; a busy default is replaced by a free port.
#   BATON_CP_TIMEOUT        seconds to wait for /readyz (default 120)
#   BATON_CP_ETCD_QUOTA_BYTES  etcd's --quota-backend-bytes (default: etcd's own, 2 GiB; the
#                           ledger load benchmark needs more)
#   BATON_KEEP_BUILD=1      keep the kube-apiserver build tree and Go cache after a successful build
set -euo pipefail

readonly K8S_SERIES=1.20
CP_DIR=${BATON_CP_DIR:-${TMPDIR:-/tmp}/baton-control-plane}
CACHE_DIR=${BATON_CACHE_DIR:-${HOME:?HOME is not set}/.cache/baton}
BIN_CACHE=$CACHE_DIR/k8s-$K8S_SERIES
BUILD_DIR=$CACHE_DIR/build-k8s-$K8S_SERIES
BUILD_LOG=$CACHE_DIR/build-k8s-$K8S_SERIES.log
DOWNLOAD_DIR=$CACHE_DIR/downloads
GO_BUILD_CACHE=$CACHE_DIR/go-build-cache
READY_TIMEOUT=${BATON_CP_TIMEOUT:-120}
readonly CONTEXT=baton-local
readonly MARKER=.baton-control-plane
readonly SERVICE_CIDR=10.0.0.0/24
# Built together, once, from Debian's kubernetes source: the API server alone serves the
# integration tests; all five make the real node (hack/node.sh).
readonly SERVER_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

KUBECONFIG_PATH=$CP_DIR/kubeconfig
PKI=$CP_DIR/pki

LOG_TAG=control-plane
STATE_DIR=$CP_DIR
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<EOF
Usage: ${0##*/} <command>

Commands:
  install   make sure kube-apiserver and etcd exist (the first build takes ~5-6 minutes)
  up        install if needed, start etcd + kube-apiserver on 127.0.0.1, write the kubeconfig,
            wait for /readyz; does nothing if already up and healthy
  down      stop the processes started by 'up' (by PID file) and remove the state dir
  status    report whether the control plane is up (exit 0 if up and ready, 1 otherwise)
  env       print 'export KUBECONFIG=...'; use: eval "\$(${0##*/} env)"
  pause-apiserver   SIGSTOP the kube-apiserver only (it stops answering, as an unreachable server)
  resume-apiserver  SIGCONT it
  help      this text

State dir:  $CP_DIR
Kubeconfig: $KUBECONFIG_PATH (context '$CONTEXT')
Cache:      $BIN_CACHE
EOF
}

# ---------------------------------------------------------------------------
# small helpers

newest() { # newest DIR GLOB — the file with the highest version-sorted name, or nothing
  find "$1" -maxdepth 1 -name "$2" -print 2>/dev/null | sort -V | tail -n1
}

# ---------------------------------------------------------------------------
# locating and installing the binaries

find_apiserver() {
  if [[ -n ${TEST_ASSET_KUBE_APISERVER:-} ]]; then
    [[ -x $TEST_ASSET_KUBE_APISERVER ]] || die "TEST_ASSET_KUBE_APISERVER=$TEST_ASSET_KUBE_APISERVER is not an executable file"
    realpath "$TEST_ASSET_KUBE_APISERVER"; return 0
  fi
  if [[ -n ${KUBEBUILDER_ASSETS:-} ]]; then
    if [[ -x $KUBEBUILDER_ASSETS/kube-apiserver ]]; then realpath "$KUBEBUILDER_ASSETS/kube-apiserver"; return 0; fi
    log "note: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no kube-apiserver; looking elsewhere"
  fi
  local p
  if p=$(command -v kube-apiserver 2>/dev/null); then realpath "$p"; return 0; fi
  if [[ -x $BIN_CACHE/kube-apiserver ]]; then echo "$BIN_CACHE/kube-apiserver"; return 0; fi
  return 1
}

find_etcd() {
  if [[ -n ${TEST_ASSET_ETCD:-} ]]; then
    [[ -x $TEST_ASSET_ETCD ]] || die "TEST_ASSET_ETCD=$TEST_ASSET_ETCD is not an executable file"
    realpath "$TEST_ASSET_ETCD"; return 0
  fi
  if [[ -n ${KUBEBUILDER_ASSETS:-} ]]; then
    if [[ -x $KUBEBUILDER_ASSETS/etcd ]]; then realpath "$KUBEBUILDER_ASSETS/etcd"; return 0; fi
    log "note: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no etcd; looking elsewhere"
  fi
  local p
  if p=$(command -v etcd 2>/dev/null); then realpath "$p"; return 0; fi
  if [[ -x $BIN_CACHE/etcd ]]; then echo "$BIN_CACHE/etcd"; return 0; fi
  if [[ -x /usr/bin/etcd ]]; then echo /usr/bin/etcd; return 0; fi
  return 1
}

POLICY_RC=/usr/sbin/policy-rc.d
CREATED_POLICY_RC=0
cleanup_policy_rc() {
  if [[ $CREATED_POLICY_RC -eq 1 ]]; then
    as_root rm -f "$POLICY_RC" || true
    CREATED_POLICY_RC=0
  fi
}

install_etcd() {
  log "installing etcd from Debian's etcd-server package (its service will not be started)"
  # policy-rc.d exit 101 = "do not start services" for invoke-rc.d / deb-systemd-invoke.
  if [[ ! -e $POLICY_RC ]]; then
    printf '#!/bin/sh\n# temporary, from baton hack/control-plane.sh\nexit 101\n' | as_root tee "$POLICY_RC" >/dev/null
    as_root chmod 755 "$POLICY_RC"
    CREATED_POLICY_RC=1
  fi
  apt_install etcd-server
  cleanup_policy_rc
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    # systemd is running: make sure the packaged service neither runs now nor at boot.
    as_root systemctl disable --now etcd.service >/dev/null 2>&1 || true
    log "disabled the packaged etcd.service (this script starts /usr/bin/etcd itself)"
  fi
}

# Building the server binaries from Debian's kubernetes source package: build_apiserver runs
# the eight steps below in order, none in a subshell, so the `export` and `cd` between steps 2
# and 3 hold for the steps after them, and a failing step ends the script.

readonly GO_BIN=/usr/lib/go/bin/go   # Debian's golang-go
K8S_SRC=$BUILD_DIR/gopath/src/k8s.io/kubernetes
# Set by the steps for the ones after them: the start of the build ($SECONDS), Debian's version
# of the kubernetes source, the upstream version in it, and the reflect2 put into its vendor tree.
BUILD_T0=
K8S_DEBVER=
K8S_UPVER=
REFLECT2_VER=
GO_BUILD_PID=   # step 6's background `go build` while it runs, for on_exit to stop

build_fail() {
  log "---- last 40 lines of $BUILD_LOG ----"
  tail -n 40 "$BUILD_LOG" >&2 || true
  die "kube-apiserver build failed: $* (full log: $BUILD_LOG; re-running starts the build over cleanly)"
}
# build_step N DESCRIPTION
build_step() { log "[$1/8] $2  (+$((SECONDS - BUILD_T0))s)"; printf '\n==== [%s/8] %s (%s)\n' "$1" "$2" "$(date -u +%FT%TZ)" >>"$BUILD_LOG"; }

# Build kube-apiserver 1.20 from Debian's `kubernetes` source package into $BIN_CACHE.
build_apiserver() {
  is_debian || die "no kube-apiserver found and this is not Debian: set KUBEBUILDER_ASSETS (e.g. \$(setup-envtest use -p path 1.20.x)) or TEST_ASSET_KUBE_APISERVER"
  take_lock "$CACHE_DIR/.build.lock" 8 "kube-apiserver build"
  if [[ -x $BIN_CACHE/kube-apiserver && ( ${BATON_BUILD_ALL:-0} != 1 || -x $BIN_CACHE/kube-proxy ) ]]; then
    log "built meanwhile: $BIN_CACHE"
    return 0
  fi
  BUILD_T0=$SECONDS
  mkdir -p "$CACHE_DIR" "$DOWNLOAD_DIR" "$BIN_CACHE"
  : >"$BUILD_LOG"
  log "building the Kubernetes $K8S_SERIES server binaries (${SERVER_BINARIES[*]}) from Debian's kubernetes source package (one-time, ~4-7 min on 2 cores)"
  log "build log: $BUILD_LOG"

  build_step 1 "build tools: golang-go, dpkg-dev, openssl"
  install_build_tools
  build_step 2 "deb-src entry and the kubernetes source package"
  ensure_kubernetes_deb_src
  fetch_kubernetes_source

  export GOPATH=$BUILD_DIR/gopath GO111MODULE=off CGO_ENABLED=0 GOFLAGS='' GOENV=off GOPROXY=off \
    GOCACHE=$GO_BUILD_CACHE GOTOOLCHAIN=local
  cd "$K8S_SRC"   # through the symlink, so the go tool sees the import path k8s.io/kubernetes

  build_step 3 "build the vendored openapi-gen"
  build_openapi_gen
  build_step 4 "generate pkg/generated/openapi/zz_generated.openapi.go"
  generate_openapi
  build_step 5 "replace vendored github.com/modern-go/reflect2 with Debian's v1.0.2 (Go >= 1.18 fix)"
  vendor_debian_reflect2
  build_step 6 "go build the server binaries: ${SERVER_BINARIES[*]} (the long part, ~4-7 min)"
  go_build_server_binaries
  build_step 7 "check the binaries"
  check_server_binaries
  build_step 8 "install into $BIN_CACHE"
  install_server_binaries
  cd /
  if [[ ${BATON_KEEP_BUILD:-0} != 1 ]]; then
    rm -rf "$BUILD_DIR" "$GO_BUILD_CACHE"
  fi
  log "server binaries ready in $BIN_CACHE (build took $((SECONDS - BUILD_T0))s)"
}

# step 1
install_build_tools() {
  local pkgs=()
  [[ -x $GO_BIN ]] || pkgs+=(golang-go)
  command -v dpkg-source >/dev/null 2>&1 || pkgs+=(dpkg-dev)
  command -v xz >/dev/null 2>&1 || pkgs+=(xz-utils)
  [[ ${#pkgs[@]} -eq 0 ]] || apt_install "${pkgs[@]}"
  [[ -x $GO_BIN ]] || build_fail "Debian's go ($GO_BIN) missing after installing golang-go"
  "$GO_BIN" version >>"$BUILD_LOG" 2>&1
}

# step 2, first half: a deb-src entry, unless apt already knows the kubernetes source package.
ensure_kubernetes_deb_src() {
  if ! apt-cache showsrc kubernetes 2>/dev/null | grep '^Package: kubernetes' >/dev/null; then
    local codename uri
    codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null | tr -d '"' || true)
    [[ -n $codename ]] || build_fail "cannot determine the Debian codename from /etc/os-release"
    [[ $codename == bookworm ]] || log "warning: written for Debian bookworm; this is '$codename'"
    # The source packages come from the archive the machine's binary packages come from.
    uri=$(debian_archive_uri)
    log "adding /etc/apt/sources.list.d/baton-deb-src.sources (deb-src $uri $codename main)"
    as_root tee /etc/apt/sources.list.d/baton-deb-src.sources >/dev/null <<EOF
# Added by baton hack/control-plane.sh: source packages for $codename main
# (kube-apiserver is built from Debian's kubernetes source package).
Types: deb-src
URIs: $uri
Suites: $codename
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    APT_UPDATED=0
    apt_update
    apt-cache showsrc kubernetes 2>/dev/null | grep '^Package: kubernetes' >/dev/null \
      || build_fail "apt-get source kubernetes: no source package found even with the deb-src entry"
  fi
}

# step 2, second half: download and unpack the source into a new build tree at $K8S_SRC; sets
# K8S_DEBVER and K8S_UPVER.
fetch_kubernetes_source() {
  # Start from a clean build tree every time: a half-finished one is never reused.
  rm -rf "$BUILD_DIR"
  mkdir -p "$BUILD_DIR/gopath/src/k8s.io" "$BUILD_DIR/bin"
  (cd "$DOWNLOAD_DIR" && apt-get source --download-only -q kubernetes) >>"$BUILD_LOG" 2>&1 \
    || build_fail "apt-get source --download-only kubernetes"
  local dsc
  dsc=$(newest "$DOWNLOAD_DIR" 'kubernetes_*.dsc')
  [[ -n $dsc ]] || build_fail "no kubernetes .dsc downloaded"
  if ! dpkg-source -x "$dsc" "$BUILD_DIR/kubernetes-src" >>"$BUILD_LOG" 2>&1; then
    # A corrupt download: fetch again once.
    rm -f "$DOWNLOAD_DIR"/kubernetes_*
    rm -rf "$BUILD_DIR/kubernetes-src"
    (cd "$DOWNLOAD_DIR" && apt-get source --download-only -q kubernetes) >>"$BUILD_LOG" 2>&1 \
      || build_fail "apt-get source --download-only kubernetes"
    dsc=$(newest "$DOWNLOAD_DIR" 'kubernetes_*.dsc')
    [[ -n $dsc ]] || build_fail "no kubernetes .dsc downloaded"
    dpkg-source -x "$dsc" "$BUILD_DIR/kubernetes-src" >>"$BUILD_LOG" 2>&1 || build_fail "dpkg-source -x $dsc"
  fi
  # GOPATH mode, as Kubernetes 1.20's own build does: the tree at $GOPATH/src/k8s.io/kubernetes.
  ln -s "$BUILD_DIR/kubernetes-src" "$K8S_SRC"
  K8S_DEBVER=$(basename "$dsc" .dsc); K8S_DEBVER=${K8S_DEBVER#kubernetes_}
  K8S_UPVER=${K8S_DEBVER%-*}; K8S_UPVER=${K8S_UPVER##*really}      # 1.20.5+really1.20.2-1.1+deb12u1 -> 1.20.2
  [[ $K8S_UPVER == "$K8S_SERIES".* ]] || build_fail "Debian's kubernetes source is $K8S_DEBVER, expected $K8S_SERIES.x"
  log "      source: kubernetes $K8S_DEBVER (upstream v$K8S_UPVER)"
}

# step 3 (this and the steps after it run in $K8S_SRC)
build_openapi_gen() {
  "$GO_BIN" build -o "$BUILD_DIR/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen >>"$BUILD_LOG" 2>&1 \
    || build_fail "go build openapi-gen"
}

# step 4
generate_openapi() {
  # Same package set as the upstream Makefile.generated_files (KUBE target): every dir with a
  # file that has a '// +k8s:' tag and mentions '+k8s:openapi-gen=', staging seen as vendor/,
  # minus code-generator and sample-apiserver.
  local dirs ndirs
  dirs=$(
    { find -H . \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune -o -type f -name '*.go' -print0 \
        | xargs -0 grep -lZ '^// *+k8s:' \
        | xargs -0 grep -l '+k8s:openapi-gen=' || true; } \
      | sed -e 's|^\./staging/src|vendor|' -e 's|^\./||' -e 's|/[^/]*$||' \
      | { grep -vE '^vendor/k8s\.io/(code-generator|sample-apiserver)(/|$)' || true; } \
      | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -
  )
  ndirs=$(tr ',' '\n' <<<"$dirs" | grep -c . || true)
  echo "openapi-gen input packages ($ndirs): $dirs" >>"$BUILD_LOG"
  [[ $ndirs -gt 50 ]] || build_fail "found only $ndirs packages tagged +k8s:openapi-gen="
  "$BUILD_DIR/bin/openapi-gen" --logtostderr \
    -i "$dirs" \
    -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi \
    -o "$GOPATH/src" \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -r "$BUILD_DIR/api-rule-violations.report" >>"$BUILD_LOG" 2>&1 \
    || build_fail "openapi-gen"
  [[ -s pkg/generated/openapi/zz_generated.openapi.go ]] || build_fail "openapi-gen produced no zz_generated.openapi.go"
  # Upstream fails on unknown API-rule violations; here they are only informational.
  diff "$BUILD_DIR/api-rule-violations.report" api/api-rules/violation_exceptions.list >>"$BUILD_LOG" 2>&1 || true
}

# step 5; sets REFLECT2_VER.
vendor_debian_reflect2() {
  local deb
  deb=$(newest "$DOWNLOAD_DIR" 'golang-github-modern-go-reflect2-dev_*.deb')
  if [[ -z $deb ]] || ! dpkg-deb --info "$deb" >/dev/null 2>&1; then
    rm -f "$DOWNLOAD_DIR"/golang-github-modern-go-reflect2-dev_*.deb
    (cd "$DOWNLOAD_DIR" && apt-get download -q golang-github-modern-go-reflect2-dev) >>"$BUILD_LOG" 2>&1 \
      || build_fail "apt-get download golang-github-modern-go-reflect2-dev"
    deb=$(newest "$DOWNLOAD_DIR" 'golang-github-modern-go-reflect2-dev_*.deb')
    [[ -n $deb ]] || build_fail "golang-github-modern-go-reflect2-dev was not downloaded"
  fi
  REFLECT2_VER=$(dpkg-deb -f "$deb" Version)
  dpkg --compare-versions "$REFLECT2_VER" ge 1.0.2 || build_fail "golang-github-modern-go-reflect2-dev is $REFLECT2_VER, need >= 1.0.2"
  dpkg-deb -x "$deb" "$BUILD_DIR/reflect2"
  local r2src=$BUILD_DIR/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2
  local r2dst=vendor/github.com/modern-go/reflect2
  [[ -f $r2src/reflect2.go && -d $r2dst ]] || build_fail "unexpected reflect2 layout"
  rm -f "$r2dst"/*.go "$r2dst"/*.s
  cp "$r2src"/*.go "$r2src"/*.s "$r2dst"/
  log "      reflect2 $REFLECT2_VER"
}

# step 6
go_build_server_binaries() {
  local pfx=k8s.io/kubernetes/vendor/k8s.io ldflags="-s -w" kv key val
  for kv in "gitVersion=v$K8S_UPVER" "gitMajor=${K8S_UPVER%%.*}" "gitMinor=$(cut -d. -f2 <<<"$K8S_UPVER")" \
            "gitTreeState=archive" "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
    key=${kv%%=*}; val=${kv#*=}
    ldflags+=" -X $pfx/component-base/version.$key=$val -X $pfx/client-go/pkg/version.$key=$val"
  done
  local out=$BUILD_DIR/go-build.out name
  local -a cmds=()
  for name in "${SERVER_BINARIES[@]}"; do cmds+=("./cmd/$name"); done
  # One `go build` of all five shares their common packages (one compile, not five).
  # providerless drops the in-tree cloud providers, dockerless the dockershim: neither is used.
  "$GO_BIN" build -v -tags providerless,dockerless -o "$BUILD_DIR/bin/" -ldflags "$ldflags" "${cmds[@]}" >"$out" 2>&1 8>&- 9>&- &
  local gopid=$! rc=0 t1=$SECONDS next=$((SECONDS + 30))
  GO_BUILD_PID=$gopid
  while kill -0 "$gopid" 2>/dev/null; do
    sleep 2
    if [[ $SECONDS -ge $next ]]; then
      log "      ... still compiling: $((SECONDS - t1))s, $(wc -l <"$out") packages done"
      next=$((SECONDS + 30))
    fi
  done
  wait "$gopid" || rc=$?
  GO_BUILD_PID=
  cat "$out" >>"$BUILD_LOG"
  [[ $rc -eq 0 ]] || build_fail "go build ${cmds[*]} (exit $rc)"
  log "      compiled in $((SECONDS - t1))s"
}

# step 7
check_server_binaries() {
  local name
  for name in "${SERVER_BINARIES[@]}"; do
    "$BUILD_DIR/bin/$name" --version >>"$BUILD_LOG" 2>&1 || build_fail "the built $name does not run"
  done
  log "      $("$BUILD_DIR/bin/kube-apiserver" --version)"
}

# step 8
install_server_binaries() {
  local name
  for name in "${SERVER_BINARIES[@]}"; do
    cp "$BUILD_DIR/bin/$name" "$BIN_CACHE/.$name.tmp.$$"
    mv -f "$BIN_CACHE/.$name.tmp.$$" "$BIN_CACHE/$name"
  done
  # The node's pause image is compiled from the same source tree's pause.c.
  cp build/pause/linux/pause.c "$BIN_CACHE/pause.c"
  cat >"$BIN_CACHE/BUILD-INFO" <<EOF
${SERVER_BINARIES[*]} v$K8S_UPVER built $(date -u +%FT%TZ) by baton hack/control-plane.sh
source: Debian kubernetes $K8S_DEBVER (GOPATH mode, generated openapi, reflect2 $REFLECT2_VER, tags providerless,dockerless)
go: $("$GO_BIN" version)
EOF
}

# Resolve (and if needed install) both binaries into APISERVER_BIN / ETCD_BIN.
APISERVER_BIN=
ETCD_BIN=
ensure_binaries() {
  # Misconfigured envtest variables are an error, not a reason to build.
  if [[ -n ${TEST_ASSET_KUBE_APISERVER:-} && ! -x $TEST_ASSET_KUBE_APISERVER ]]; then
    die "TEST_ASSET_KUBE_APISERVER=$TEST_ASSET_KUBE_APISERVER is not an executable file"
  fi
  if [[ -n ${TEST_ASSET_ETCD:-} && ! -x $TEST_ASSET_ETCD ]]; then
    die "TEST_ASSET_ETCD=$TEST_ASSET_ETCD is not an executable file"
  fi
  if ! ETCD_BIN=$(find_etcd); then
    install_etcd
    ETCD_BIN=$(find_etcd) || die "etcd still not found after installing etcd-server"
  fi
  if ! APISERVER_BIN=$(find_apiserver); then
    build_apiserver
    APISERVER_BIN=$(find_apiserver) || die "kube-apiserver still not found after the build"
  fi
  ensure_tool openssl openssl
  ensure_tool curl curl
}

# All five server binaries (hack/node.sh): built unless every one is already in the cache.
cmd_build() {
  local name
  for name in "${SERVER_BINARIES[@]}"; do
    [[ -x $BIN_CACHE/$name && -f $BIN_CACHE/pause.c ]] || { build_apiserver; return; }
  done
  log "server binaries already built: $BIN_CACHE"
}

cmd_install() {
  ensure_binaries
  log "kube-apiserver: $APISERVER_BIN"
  log "etcd:           $ETCD_BIN"
}

# ---------------------------------------------------------------------------
# processes

stop_all() {
  stop_proc kube-apiserver
  stop_proc etcd
}

readyz() { # prints the /readyz body; status 0 only if it is "ok"
  local port token body
  port=$(read_state API_PORT) || return 1
  token=$(<"$CP_DIR/admin.token") || return 1
  body=$(curl -sS --max-time 3 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $token" \
    "https://127.0.0.1:$port/readyz" 2>&1) || { echo "$body"; return 1; }
  echo "$body"
  [[ $body == ok ]]
}

is_up() {
  proc_is_ours etcd && proc_is_ours kube-apiserver && readyz >/dev/null 2>&1
}

# ---------------------------------------------------------------------------
# certificates and kubeconfig

gen_pki() {
  mkdir -p "$PKI"
  local olog=$CP_DIR/openssl.log
  {
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
      -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -subj "/CN=baton-local-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
    openssl req -new -newkey rsa:2048 -nodes -sha256 \
      -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" -subj "/CN=kube-apiserver"
    cat >"$PKI/apiserver.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:0:0:0:0:0:0:0:1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    openssl x509 -req -sha256 -days 365 -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
      -CAcreateserial -out "$PKI/apiserver.crt" -extfile "$PKI/apiserver.ext"
    openssl genrsa -out "$PKI/sa.key" 2048
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
    gen_webhook_client "$PKI" "$CP_DIR"
  } >>"$olog" 2>&1 || { tail -n 20 "$olog" >&2; die "openssl failed (log: $olog)"; }
  chmod 600 "$PKI"/*.key
}

write_kubeconfig() { # PORT TOKEN
  local tmp=$KUBECONFIG_PATH.tmp
  cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $CONTEXT
  cluster:
    server: https://127.0.0.1:$1
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $CONTEXT-admin
  user:
    token: $2
contexts:
- name: $CONTEXT
  context:
    cluster: $CONTEXT
    user: $CONTEXT-admin
    namespace: default
current-context: $CONTEXT
EOF
  chmod 600 "$tmp"
  mv -f "$tmp" "$KUBECONFIG_PATH"
}

# ---------------------------------------------------------------------------
# commands

# 1 while `up` is between creating the state dir and /readyz: on failure, stop what it started.
UP_IN_PROGRESS=0

print_ready() {
  log "kube-apiserver: https://127.0.0.1:$(read_state API_PORT)  etcd: http://127.0.0.1:$(read_state ETCD_PORT)"
  log "kubeconfig:     $KUBECONFIG_PATH (context $CONTEXT)"
  log "use it with:    eval \"\$(${0} env)\"   or   kubectl --kubeconfig $KUBECONFIG_PATH ..."
  echo "KUBECONFIG=$KUBECONFIG_PATH"
}

# The state dir for a new `up`: a stopped or unhealthy control plane of ours is cleaned up
# first; a directory this script did not create is refused.
make_state_dir() {
  if [[ -e $CP_DIR ]]; then
    if [[ -f $CP_DIR/$MARKER ]]; then
      log "found a stopped or unhealthy control plane in $CP_DIR; cleaning it up first"
      stop_all
      rm -rf "$CP_DIR"
    elif [[ -d $CP_DIR && -z $(ls -A "$CP_DIR") ]]; then
      rmdir "$CP_DIR"
    else
      die "$CP_DIR exists and was not created by this script; refusing to use it (set BATON_CP_DIR elsewhere)"
    fi
  fi
  (umask 077 && mkdir -p "$CP_DIR")
  : >"$CP_DIR/$MARKER"
}

start_etcd() { # CLIENT-PORT PEER-PORT
  local etcd_port=$1 peer_port=$2
  local -a etcd_args=(
    --name=baton --data-dir="$CP_DIR/etcd-data"
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port"
    --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port"
    --initial-cluster="baton=http://127.0.0.1:$peer_port" --initial-cluster-state=new
    --logger=zap
  )
  if [[ -n ${BATON_CP_ETCD_QUOTA_BYTES:-} ]]; then
    [[ $BATON_CP_ETCD_QUOTA_BYTES =~ ^[0-9]+$ ]] || die "BATON_CP_ETCD_QUOTA_BYTES=$BATON_CP_ETCD_QUOTA_BYTES is not a byte count"
    etcd_args+=(--quota-backend-bytes="$BATON_CP_ETCD_QUOTA_BYTES")
  fi
  # Test data only: skip fsync when this etcd supports it (3.4.10+).
  if "$ETCD_BIN" --help 2>&1 | grep -- '--unsafe-no-fsync' >/dev/null; then etcd_args+=(--unsafe-no-fsync); fi
  case $(uname -m) in aarch64 | arm64) export ETCD_UNSUPPORTED_ARCH=arm64 ;; esac
  start_proc etcd "$ETCD_BIN" "${etcd_args[@]}"
}

wait_for_etcd() { # CLIENT-PORT — up to 30s for its /health
  local etcd_port=$1 i
  for ((i = 0; i < 300; i++)); do
    curl -s --max-time 2 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep '"health":"true"' >/dev/null && break
    proc_is_ours etcd || { log "---- last 30 lines of $CP_DIR/etcd.log ----"; tail -n 30 "$CP_DIR/etcd.log" >&2; die "etcd exited during start-up"; }
    sleep 0.1
  done
  [[ $i -lt 300 ]] || { tail -n 30 "$CP_DIR/etcd.log" >&2; die "etcd not healthy after 30s"; }
}

start_apiserver() { # API-PORT ETCD-CLIENT-PORT
  local api_port=$1 etcd_port=$2
  start_proc kube-apiserver "$APISERVER_BIN" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --token-auth-file="$CP_DIR/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --endpoint-reconciler-type=none \
    --disable-admission-plugins=ServiceAccount \
    --admission-control-config-file="$CP_DIR/admission.yaml" \
    --allow-privileged=true
}

wait_for_readyz() { # T0 — the $SECONDS the wait began; gives up READY_TIMEOUT seconds after it
  local t0=$1 body=
  log "waiting for /readyz (timeout ${READY_TIMEOUT}s)"
  while :; do
    if body=$(readyz); then break; fi
    if ! proc_is_ours kube-apiserver; then
      log "---- last 40 lines of $CP_DIR/kube-apiserver.log ----"; tail -n 40 "$CP_DIR/kube-apiserver.log" >&2
      die "kube-apiserver exited during start-up"
    fi
    if ! proc_is_ours etcd; then
      log "---- last 30 lines of $CP_DIR/etcd.log ----"; tail -n 30 "$CP_DIR/etcd.log" >&2
      die "etcd exited during start-up"
    fi
    if ((SECONDS - t0 >= READY_TIMEOUT)); then
      log "---- last 40 lines of $CP_DIR/kube-apiserver.log ----"; tail -n 40 "$CP_DIR/kube-apiserver.log" >&2
      log "---- last /readyz answer ----"; printf '%s\n' "$body" | tail -n 30 >&2
      die "kube-apiserver not ready after ${READY_TIMEOUT}s (BATON_CP_TIMEOUT)"
    fi
    sleep 0.25
  done
}

cmd_up() {
  take_lock "$CP_DIR.lock" 9 "$0 up/down"
  if [[ -f $CP_DIR/$MARKER ]] && is_up; then
    log "control plane already up and ready"
    print_ready
    return 0
  fi
  ensure_binaries

  make_state_dir
  UP_IN_PROGRESS=1

  local etcd_port peer_port api_port token
  etcd_port=$(choose_port "${BATON_CP_ETCD_PORT:-}" 2379 etcd-client)
  peer_port=$(choose_port "${BATON_CP_ETCD_PEER_PORT:-}" 2380 etcd-peer "$etcd_port")
  api_port=$(choose_port "${BATON_CP_API_PORT:-}" 6443 kube-apiserver "$etcd_port" "$peer_port")
  [[ $etcd_port != "$peer_port" && $api_port != "$etcd_port" && $api_port != "$peer_port" ]] \
    || die "ports must differ: etcd $etcd_port, etcd peer $peer_port, apiserver $api_port"
  printf 'API_PORT=%s\nETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPISERVER_BIN=%s\nETCD_BIN=%s\n' \
    "$api_port" "$etcd_port" "$peer_port" "$APISERVER_BIN" "$ETCD_BIN" >"$CP_DIR/state"

  gen_pki
  token=$(openssl rand -hex 32)
  (umask 077 && printf '%s\n' "$token" >"$CP_DIR/admin.token")
  (umask 077 && printf '%s,admin,admin,system:masters\n' "$token" >"$CP_DIR/tokens.csv")

  start_etcd "$etcd_port" "$peer_port"
  wait_for_etcd "$etcd_port"
  write_kubeconfig "$api_port" "$token"
  start_apiserver "$api_port" "$etcd_port"
  local t0=$SECONDS
  wait_for_readyz "$t0"
  UP_IN_PROGRESS=0
  log "control plane ready in $((SECONDS - t0))s after start"
  print_ready
}

cmd_down() {
  take_lock "$CP_DIR.lock" 9 "$0 up/down"
  if [[ ! -e $CP_DIR ]]; then
    log "control plane is not running (no $CP_DIR)"
    return 0
  fi
  if [[ ! -f $CP_DIR/$MARKER ]]; then
    if [[ -d $CP_DIR && -z $(ls -A "$CP_DIR") ]]; then
      rmdir "$CP_DIR"
      log "control plane is not running (removed empty $CP_DIR)"
      return 0
    fi
    die "$CP_DIR was not created by this script; not touching it"
  fi
  stop_all
  rm -rf "$CP_DIR"
  log "control plane down; removed $CP_DIR"
}

cmd_status() {
  if [[ ! -f $CP_DIR/$MARKER ]]; then
    echo "down (no state in $CP_DIR)"
    return 1
  fi
  local name pid ok=1
  for name in etcd kube-apiserver; do
    if proc_is_ours "$name"; then
      pid=$(<"$CP_DIR/$name.pid")
      echo "$name: running (pid $pid)"
    else
      echo "$name: not running"
      ok=0
    fi
  done
  if [[ $ok -eq 1 ]] && readyz >/dev/null 2>&1; then
    echo "up: https://127.0.0.1:$(read_state API_PORT) ready; kubeconfig $KUBECONFIG_PATH (context $CONTEXT)"
    return 0
  fi
  echo "not ready (state in $CP_DIR; run '$0 down' or '$0 up')"
  return 1
}

cmd_env() {
  if ! is_up; then
    log "warning: the control plane is not up; run: $0 up"
  fi
  printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_PATH"
  # The CA of the API server's client certificate towards webhooks (gen_webhook_client).
  printf 'export BATON_WEBHOOK_CLIENT_CA=%q\n' "$PKI/webhook-client-ca.crt"
}

cmd_signal_apiserver() { # SIGNAL
  proc_is_ours kube-apiserver || die "kube-apiserver is not running (state in $CP_DIR)"
  local pid
  pid=$(<"$CP_DIR/kube-apiserver.pid")
  kill -"$1" "$pid"
  log "sent SIG$1 to kube-apiserver (pid $pid)"
}

on_exit() {
  if [[ -n ${GO_BUILD_PID:-} ]]; then
    kill -TERM "$GO_BUILD_PID" 2>/dev/null || true   # our own background `go build`
  fi
  cleanup_policy_rc
  if [[ ${UP_IN_PROGRESS:-0} -eq 1 && -f $CP_DIR/$MARKER ]]; then
    UP_IN_PROGRESS=0
    log "start-up failed; stopping what was started (logs kept in $CP_DIR until 'down' or the next 'up')"
    stop_all || true
  fi
}

main() {
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local sub=${1:-help}
  [[ $# -gt 0 ]] && shift
  [[ $# -eq 0 ]] || die "unexpected arguments: $* (see: $0 help)"
  case $sub in
    install) cmd_install ;;
    build) cmd_build ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    pause-apiserver) cmd_signal_apiserver STOP ;;
    resume-apiserver) cmd_signal_apiserver CONT ;;
    help | -h | --help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
