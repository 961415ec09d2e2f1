#!/usr/bin/env bash
# hack/node.sh — a real single-node Kubernetes 1.20 for baton's end-to-end tests:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet on containerd + runc,
# CNI bridge networking and kube-proxy, all inside a network namespace of its own. The root
# namespace keeps one loopback listener that relays to the API server (hack/relay.py).
#
#   hack/node.sh install     the packages and the server binaries (built once, cached)
#   hack/node.sh up          start the node and wait until it is Ready; cleans up a run that was
#                            killed midway first; does nothing if already up and Ready
#   hack/node.sh down        stop exactly what `up` started (by PID), unmount, delete the network
#                            namespace, remove kubelet cgroups, restore the sysctls the kubelet set
#   hack/node.sh status      exit 0 if up and the node is Ready
#   hack/node.sh env         print `export KUBECONFIG=...` (the API server through the relay)
#   hack/node.sh import ARCHIVE...   import OCI image archives into the node's containerd
#   hack/node.sh stop-kubelet / start-kubelet     the node lost and back (the pods keep running)
#   hack/node.sh restart-apiserver                kube-apiserver stopped and started again
#   hack/node.sh pause-apiserver / resume-apiserver  SIGSTOP / SIGCONT it (an unreachable server)
#   hack/node.sh nsenter CMD...                   run CMD inside the node's network namespace
#
# Network rule: every address is loopback or inside the namespace this script creates. Nothing
# connects to or binds the machine's own interfaces.
#
# Environment:
#   BATON_NODE_DIR     state dir (pids, certs, logs, kubelet and containerd roots, kubeconfig)
#                      default: /tmp/baton-node
#   BATON_CACHE_DIR    binary and image cache, default: $HOME/.cache/baton
#   BATON_NODE_PORT    the relay's port on 127.0.0.1 (default 16443, or the next free one)
#   BATON_NODE_TIMEOUT seconds to wait for a Ready node (default 180)
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE_DIR=${BATON_NODE_DIR:-/tmp/baton-node}
CACHE_DIR=${BATON_CACHE_DIR:-${HOME:?HOME is not set}/.cache/baton}
BIN_CACHE=$CACHE_DIR/k8s-1.20
READY_TIMEOUT=${BATON_NODE_TIMEOUT:-180}
LOG_TAG=node
# shellcheck source=hack/lib.sh
source "$HACK/lib.sh"

readonly NETNS=baton-node
readonly NETNS_PATH=/run/netns/$NETNS
readonly NODE_NAME=baton-node
readonly NODE_BRIDGE=bnode0         # carries the node IP; it has no ports, so nothing leaves
readonly NODE_IP=10.77.0.1
readonly POD_CIDR=10.78.0.0/24
readonly POD_BRIDGE=bcni0
readonly SERVICE_CIDR=10.96.0.0/24
readonly SERVICE_IP=10.96.0.1       # the `kubernetes` Service
readonly MARKER=.baton-node
readonly PAUSE_IMAGE=registry.k8s.io/pause:3.2
# The kubelet sets these host sysctls (they are not namespaced): recorded at `up`, restored at `down`.
readonly HOST_SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Stopped in this order (the reverse of the start).
readonly DAEMONS=(relay kube-proxy kubelet containerd kube-scheduler kube-controller-manager kube-apiserver etcd)

PKI=$STATE_DIR/pki
KUBECONFIG_OUT=$STATE_DIR/kubeconfig          # root namespace, through the relay
CTR_SOCK=$STATE_DIR/containerd/containerd.sock
START_PREFIX=(nsenter "--net=$NETNS_PATH")

usage() { sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------------------
# install

install_packages() {
  local -a need=() pkg
  for pkg in containerd runc containernetworking-plugins iptables conntrack etcd-server openssl curl \
    podman buildah skopeo mmdebstrap busybox-static gcc libc6-dev util-linux iproute2; do
    pkg_installed "$pkg" || need+=("$pkg")
  done
  ((${#need[@]} == 0)) && return 0
  # policy-rc.d exit 101: the packages' services (containerd, etcd) are never started by apt.
  local created=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# temporary, from baton hack/node.sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    created=1
  fi
  apt_install "${need[@]}"
  [[ $created -eq 0 ]] || rm -f /usr/sbin/policy-rc.d
}

have_server_binaries() {
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [[ -x $BIN_CACHE/$b ]] || return 1
  done
  [[ -f $BIN_CACHE/pause.c ]]
}

cmd_install() {
  [[ $EUID -eq 0 ]] || die "the node needs root (containerd, kubelet, network namespaces)"
  log "packages: containerd, runc, CNI plugins, iptables, etcd, podman, mmdebstrap ..."
  install_packages
  if ! have_server_binaries; then
    log "server binaries: building them once from Debian's kubernetes 1.20 source"
    # The API-server-only build of an older checkout would be found and reused: force the full one.
    BATON_BUILD_ALL=1 bash "$HACK/control-plane.sh" build
  fi
  have_server_binaries || die "server binaries missing in $BIN_CACHE after the build"
  log "server binaries: $BIN_CACHE ($(head -1 "$BIN_CACHE/BUILD-INFO" 2>/dev/null | cut -c1-60)...)"
}

# ---------------------------------------------------------------------------
# state

in_netns() { nsenter "--net=$NETNS_PATH" "$@"; }

kubectl_node() { kubectl --kubeconfig "$KUBECONFIG_OUT" --request-timeout=5s "$@"; }

node_ready() {
  [[ -f $KUBECONFIG_OUT ]] || return 1
  [[ $(kubectl_node get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

is_up() {
  [[ -f $STATE_DIR/$MARKER ]] || return 1
  local d
  for d in "${DAEMONS[@]}"; do proc_is_ours "$d" || return 1; done
  node_ready
}

# ---------------------------------------------------------------------------
# teardown: also the recovery from a run that was killed midway

# Every mount at or below DIR, deepest first.
mounts_under() {
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r
}

unmount_under() {
  local m
  for m in $(mounts_under "$1"); do umount -l "$m" 2>/dev/null || true; done
}

# Processes this node started that outlive its daemons: the containers (in the pods' cgroups)
# and the containerd shims (they name this node's containerd socket in their arguments).
leftover_pids() {
  local ctl p
  for ctl in /sys/fs/cgroup/*/kubepods; do
    [[ -d $ctl ]] && find "$ctl" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/exe" 2>/dev/null) == */containerd-shim* ]] || continue
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$CTR_SOCK" && echo "${p#/proc/}"
  done
  true
} 2>/dev/null

remove_cgroups() {
  local ctl
  for ctl in /sys/fs/cgroup/*/kubepods; do
    if [[ -d $ctl ]]; then find "$ctl" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
}

kill_leftovers() {
  local pid pids
  pids=$(leftover_pids | sort -u)
  [[ -n $pids ]] || return 0
  log "killing $(wc -w <<<"$pids") leftover container processes of this node"
  for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
  sleep 0.5
}

restore_sysctls() {
  [[ -f $STATE_DIR/sysctls ]] || return 0
  local k v
  while IFS='=' read -r k v; do
    if [[ -n $k ]]; then sysctl -q -w "$k=$v" >/dev/null 2>&1 || true; fi
  done <"$STATE_DIR/sysctls"
}

# What the node could leave in the root namespace, and only that: its own interface names
# (they live in its namespace; seen in the root one they leaked), addresses, routes and
# policy rules naming them or its address ranges, kube-proxy's and the kubelet's iptables
# chains, and the host sysctls the kubelet sets. Other programs' interfaces and routes (podman's
# CNI bridge, whose link state changes as it pleases) are not the node's and are not compared.
# Recorded at `up` (beside the state dir, which `down` removes) and compared at `down`.
ROOT_SNAPSHOT=$STATE_DIR.root-before
node_traces() { # the node's names and address prefixes, as one extended regular expression
  local cidr prefixes=()
  for cidr in "$NODE_IP" "$POD_CIDR" "$SERVICE_CIDR"; do
    cidr=${cidr%/*}
    prefixes+=("${cidr%.*}.")           # the /24's first three octets and the dot
  done
  local IFS='|' names="$NODE_BRIDGE|$POD_BRIDGE"
  local dotted=${prefixes[*]}
  echo "(^|[^[:alnum:]-])($names)([^[:alnum:]-]|\$)|KUBE-|kube-|${dotted//./\\.}"
}
of_node() { grep -E "$1" || true; }   # no line of the node's is no error
root_snapshot() {
  local t; t=$(node_traces)
  echo "## links"; ip -o link show | awk -F': ' '{print $2}' | of_node "$t" | sort
  echo "## addresses"; ip -o addr show | awk '{print $2, $4}' | of_node "$t" | sort
  echo "## routes"; ip route show | of_node "$t" | sort
  echo "## rules"; ip rule show | of_node "$t" | sort
  echo "## iptables"; { iptables-save 2>/dev/null || true; } | sed -e '/^#/d' -e 's/\[[0-9:]*\]//' | of_node "$t" | sort
  echo "## sysctls"; local k; for k in "${HOST_SYSCTLS[@]}" net.ipv4.ip_forward; do echo "$k=$(sysctl -n "$k")"; done
}

# Anything of the node still here after teardown: processes, mounts, namespaces, cgroups, and
# differences from the root namespace as it was before `up`.
leftovers() {
  local pids
  pids=$(leftover_pids | sort -u)
  [[ -z $pids ]] || echo "processes: $pids"
  mounts_under "$STATE_DIR" | sed 's/^/mount: /'
  [[ ! -e $NETNS_PATH ]] || echo "network namespace: $NETNS_PATH"
  local cgroup
  for cgroup in /sys/fs/cgroup/*/kubepods; do
    if [[ -e $cgroup ]]; then echo "cgroup: $cgroup"; fi
  done
  if [[ -f $ROOT_SNAPSHOT ]]; then
    diff <(cat "$ROOT_SNAPSHOT") <(root_snapshot) | grep '^[<>]' | sed 's/^/root namespace changed: /'
  fi
  true
}

teardown() {
  local d
  # The API server's graceful stop waits on requests no client will finish (every client is
  # stopped before it) for longer than the default grace; its state is etcd's, which stops
  # cleanly after it, so 2 s are enough before SIGKILL.
  for d in "${DAEMONS[@]}"; do
    if [[ $d == kube-apiserver ]]; then stop_proc "$d" 20; else stop_proc "$d"; fi
  done
  # containerd-shim processes outlive containerd: they are in the node's cgroups.
  kill_leftovers
  restore_sysctls
  unmount_under "$STATE_DIR"
  remove_cgroups
  if [[ -e $NETNS_PATH ]]; then
    ip netns del "$NETNS" 2>/dev/null || { umount -l "$NETNS_PATH" 2>/dev/null; rm -f "$NETNS_PATH"; }
  fi
  # `ip netns add` made /run/netns a mount point if it was not one: undo that when it is empty.
  if [[ -f $STATE_DIR/made-run-netns-mount ]] && [[ -z $(ls -A /run/netns 2>/dev/null) ]]; then
    umount /run/netns 2>/dev/null || true
  fi
  rm -rf "$STATE_DIR"
}

# ---------------------------------------------------------------------------
# up

gen_pki() {
  mkdir -p "$PKI"
  local olog=$STATE_DIR/openssl.log
  {
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
      -subj "/CN=baton-node-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
    sign_cert apiserver "/CN=kube-apiserver" serverAuth \
      "IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    # The API server's client certificate towards the kubelet (logs, exec, port-forward).
    sign_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth ""
    openssl genrsa -out "$PKI/sa.key" 2048
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
    gen_webhook_client "$PKI" "$STATE_DIR"
  } >>"$olog" 2>&1 || { tail -n 20 "$olog" >&2; die "openssl failed (log: $olog)"; }
  chmod 600 "$PKI"/*.key
}

sign_cert() { # NAME SUBJECT EXTENDED-USAGE SANS
  local name=$1
  openssl req -new -newkey rsa:2048 -nodes -sha256 -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "$2"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    [[ -z $4 ]] || echo "subjectAltName=$4"
  } >"$PKI/$name.ext"
  openssl x509 -req -sha256 -days 365 -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -CAcreateserial -out "$PKI/$name.crt" -extfile "$PKI/$name.ext"
}

# Static tokens, one per identity: simpler than client certificates and as real to RBAC.
gen_tokens() {
  local -a ids=("admin|system:masters" "system:kube-controller-manager|" "system:kube-scheduler|"
    "system:kube-proxy|" "system:node:$NODE_NAME|system:nodes")
  local id user groups token
  : >"$STATE_DIR/tokens.csv"
  for id in "${ids[@]}"; do
    user=${id%%|*}; groups=${id#*|}; token=$(openssl rand -hex 32)
    printf '%s,%s,%s,"%s"\n' "$token" "$user" "$user" "$groups" >>"$STATE_DIR/tokens.csv"
    write_kubeconfig "$STATE_DIR/kubeconfig-${user//:/_}" "https://127.0.0.1:6443" "$token"
    [[ $user == admin ]] && printf '%s\n' "$token" >"$STATE_DIR/admin.token"
  done
  chmod 600 "$STATE_DIR/tokens.csv" "$STATE_DIR/admin.token"
}

write_kubeconfig() { # PATH SERVER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: baton-node
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: baton-node-user
  user:
    token: $3
contexts:
- name: baton-node
  context:
    cluster: baton-node
    user: baton-node-user
    namespace: default
current-context: baton-node
EOF
  chmod 600 "$1"
}

setup_netns() {
  if ! awk '$5 == "/run/netns"' /proc/self/mountinfo | grep -q .; then
    : >"$STATE_DIR/made-run-netns-mount"
  fi
  ip netns add "$NETNS"
  in_netns ip link set lo up
  in_netns ip link add "$NODE_BRIDGE" type bridge
  in_netns ip addr add "$NODE_IP/24" dev "$NODE_BRIDGE"
  in_netns ip link set "$NODE_BRIDGE" up
  # A default route inside the namespace, onto a bridge with no ports: the kubelet and
  # kube-proxy want one, and nothing sent on it can leave the namespace.
  in_netns ip route add default dev "$NODE_BRIDGE"
  in_netns sysctl -q -w net.ipv4.ip_forward=1
}

write_configs() {
  mkdir -p "$STATE_DIR/cni/net.d" "$STATE_DIR/containerd" "$STATE_DIR/kubelet" "$STATE_DIR/kubelet-pki"
  : >"$STATE_DIR/resolv.conf"   # no DNS on the bed: pods use dnsPolicy Default and Service IPs
  cat >"$STATE_DIR/cni/net.d/10-baton-node.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "baton-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "$POD_CIDR" }]],
                "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": "$STATE_DIR/cni/ipam" }
    }
  ]
}
EOF
  local c=$STATE_DIR/containerd
  # restrict_oom_score_adj: root in this VM lacks CAP_SYS_RESOURCE, so runc cannot lower
  # oom_score_adj and every container would fail to start.
  cat >"$c/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$CTR_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$c/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE_DIR/cni/net.d"
EOF
  cat >"$STATE_DIR/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: $STATE_DIR/resolv.conf
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
nodeStatusUpdateFrequency: 4s
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# A pod's emptyDir usage is measured this often (default 1m, jittered): a workspace filled past
# its sizeLimit is evicted within seconds, not after the step that filled it has ended.
volumeStatsAggPeriod: 10s
# One pod may not take the node's process table (a fork bomb in a tools container): every
# cluster that runs baton needs a bound like it (the kubelet's podPidsLimit; no pod field sets one).
podPidsLimit: 1024
# Pods beyond the default 110: make bench-upgrade keeps 200 runs in flight. The /24 of pod
# addresses (POD_CIDR) bounds it below 254.
maxPods: 250
EOF
}

record_sysctls() {
  local k
  for k in "${HOST_SYSCTLS[@]}"; do printf '%s=%s\n' "$k" "$(sysctl -n "$k")"; done >"$STATE_DIR/sysctls"
}

wait_for() { # WHAT SECONDS COMMAND...
  local what=$1 limit=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < limit)) || die "$what not ready after ${limit}s (logs in $STATE_DIR)"
    sleep 0.25
  done
  log "$what ready (+$((SECONDS - T_UP))s)"
}

apiserver_ready() {
  curl -sf --max-time 2 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(<"$STATE_DIR/admin.token")" \
    "https://127.0.0.1:$(read_state RELAY_PORT)/readyz" | grep -qx ok
}

start_etcd() {
  start_proc etcd "$(command -v etcd)" --name=baton-node --data-dir="$STATE_DIR/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=baton-node=http://127.0.0.1:2380 --unsafe-no-fsync --logger=zap
}

start_apiserver() {
  # The default admission plugins stay on (ServiceAccount among them), as on real clusters.
  start_proc kube-apiserver "$BIN_CACHE/kube-apiserver" \
    --advertise-address="$NODE_IP" --bind-address=0.0.0.0 --secure-port=6443 \
    --etcd-servers=http://127.0.0.1:2379 \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$STATE_DIR/tokens.csv" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true \
    --admission-control-config-file="$STATE_DIR/admission.yaml" \
    --kubelet-preferred-address-types=InternalIP
}

start_controller_manager() {
  start_proc kube-controller-manager "$BIN_CACHE/kube-controller-manager" \
    --kubeconfig="$STATE_DIR/kubeconfig-system_kube-controller-manager" --leader-elect=false \
    --controllers='*,bootstrapsigner,tokencleaner' --use-service-account-credentials \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --node-monitor-grace-period=16s --node-monitor-period=2s --cluster-cidr="$POD_CIDR"
}

start_scheduler() {
  start_proc kube-scheduler "$BIN_CACHE/kube-scheduler" \
    --kubeconfig="$STATE_DIR/kubeconfig-system_kube-scheduler" --leader-elect=false
}

start_containerd() {
  start_proc containerd "$(command -v containerd)" --config "$STATE_DIR/containerd/config.toml"
}

start_kubelet() {
  start_proc kubelet "$BIN_CACHE/kubelet" \
    --config="$STATE_DIR/kubelet-config.yaml" --kubeconfig="$STATE_DIR/kubeconfig-system_node_$NODE_NAME" \
    --container-runtime=remote --container-runtime-endpoint="unix://$CTR_SOCK" \
    --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" \
    --root-dir="$STATE_DIR/kubelet" --cert-dir="$STATE_DIR/kubelet-pki"
}

start_kube_proxy() {
  # conntrack limits 0: kube-proxy leaves the host's (partly global) conntrack settings alone.
  start_proc kube-proxy "$BIN_CACHE/kube-proxy" \
    --kubeconfig="$STATE_DIR/kubeconfig-system_kube-proxy" --hostname-override="$NODE_NAME" \
    --proxy-mode=iptables --cluster-cidr="$POD_CIDR" --conntrack-max-per-core=0 \
    --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0
}

start_relay() {
  local python
  # The interpreter itself, not a wrapper script (pyenv's shims are scripts): its PID is checked.
  python=$(realpath "$(python3 -c 'import sys; print(sys.executable)')")
  # The relay binds in the root namespace and enters the node's itself.
  local -a START_PREFIX=()
  start_proc relay "$python" "$HACK/relay.py" "$(read_state RELAY_PORT)" "$NETNS_PATH" 127.0.0.1:6443
}

ctr_node() { ctr --address "$CTR_SOCK" -n k8s.io "$@"; }

# The images the node needs before any pod: pause (the sandbox) and whatever is cached.
import_images() {
  bash "$HACK/images.sh" pause >/dev/null
  local archive
  for archive in "$CACHE_DIR"/images/*.oci.tar; do
    [[ -f $archive ]] || continue
    ctr_node images import --no-unpack=false "$archive" >/dev/null 2>>"$STATE_DIR/import.log" \
      || die "importing $archive failed (log: $STATE_DIR/import.log)"
  done
  log "images imported: $(ctr_node images ls -q | grep -vc '^sha256:') (+$((SECONDS - T_UP))s)"
}

cmd_up() {
  [[ $EUID -eq 0 ]] || die "the node needs root (containerd, kubelet, network namespaces)"
  take_lock "$STATE_DIR.lock" 9 "$0 up/down"
  if is_up; then
    log "node already up and Ready"
    print_ready
    return 0
  fi
  cmd_install
  if [[ -e $STATE_DIR || -e $NETNS_PATH ]] || [[ -n $(leftover_pids) ]]; then
    log "cleaning up an earlier node (stopped, unhealthy, or killed midway)"
    teardown
  fi
  T_UP=$SECONDS
  mkdir -p "$STATE_DIR"
  : >"$STATE_DIR/$MARKER"
  UP_IN_PROGRESS=1
  printf 'RELAY_PORT=%s\n' "$(choose_port "${BATON_NODE_PORT:-}" 16443 relay)" >"$STATE_DIR/state"
  record_sysctls
  [[ -f $ROOT_SNAPSHOT ]] || { root_snapshot >"$ROOT_SNAPSHOT.tmp" && mv "$ROOT_SNAPSHOT.tmp" "$ROOT_SNAPSHOT"; }
  gen_pki
  gen_tokens
  write_kubeconfig "$KUBECONFIG_OUT" "https://127.0.0.1:$(read_state RELAY_PORT)" "$(<"$STATE_DIR/admin.token")"
  write_configs
  setup_netns
  log "network namespace $NETNS: node IP $NODE_IP, pods $POD_CIDR, services $SERVICE_CIDR"

  start_etcd
  start_containerd
  start_apiserver
  start_relay
  wait_for "kube-apiserver (via relay 127.0.0.1:$(read_state RELAY_PORT))" 90 apiserver_ready
  start_controller_manager
  start_scheduler
  wait_for containerd 30 ctr_node version
  import_images
  start_kubelet
  start_kube_proxy
  wait_for "node $NODE_NAME" "$READY_TIMEOUT" node_ready
  wait_for "default ServiceAccount" 60 kubectl_node -n default get serviceaccount default
  UP_IN_PROGRESS=0
  log "node up in $((SECONDS - T_UP))s"
  print_ready
}

print_ready() {
  log "kubeconfig: $KUBECONFIG_OUT (API server via 127.0.0.1:$(read_state RELAY_PORT))"
  echo "KUBECONFIG=$KUBECONFIG_OUT"
}

cmd_down() {
  take_lock "$STATE_DIR.lock" 9 "$0 up/down"
  if [[ ! -e $STATE_DIR && ! -e $NETNS_PATH && -z $(leftover_pids) ]]; then
    log "node is not running"
    return 0
  fi
  if [[ -e $STATE_DIR && ! -f $STATE_DIR/$MARKER ]]; then
    die "$STATE_DIR was not created by this script; not touching it"
  fi
  local t0=$SECONDS left
  teardown
  left=$(leftovers)
  [[ -z $left ]] || die "the node left something behind:"$'\n'"$left"
  rm -f "$ROOT_SNAPSHOT"
  log "node down in $((SECONDS - t0))s; nothing of it is left (processes, mounts, namespace, cgroups; in the root namespace its links, addresses, routes, rules, iptables chains and sysctls checked)"
}

cmd_status() {
  if is_up; then echo "up: node $NODE_NAME Ready; kubeconfig $KUBECONFIG_OUT"; return 0; fi
  echo "down or not Ready (state in $STATE_DIR)"
  return 1
}

cmd_env() { printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_OUT"; }

cmd_import() {
  [[ $# -gt 0 ]] || die "import: name one or more OCI archives"
  local a
  for a in "$@"; do ctr_node images import "$a" >/dev/null || die "importing $a failed"; done
}

signal_proc() { # NAME SIGNAL — only if the PID is still the process this node started
  proc_is_ours "$1" || die "$1 is not running (state in $STATE_DIR)"
  kill -"$2" "$(<"$STATE_DIR/$1.pid")"
  log "sent SIG$2 to $1"
}

on_exit() {
  if [[ ${UP_IN_PROGRESS:-0} -eq 1 ]]; then
    UP_IN_PROGRESS=0
    log "start-up failed; last lines of the daemons' logs:"
    local d
    for d in "${DAEMONS[@]}"; do
      [[ -f $STATE_DIR/$d.log ]] && { echo "---- $d"; tail -n 8 "$STATE_DIR/$d.log"; } >&2
    done
    log "stopping what was started"
    teardown || true
  fi
}

main() {
  trap on_exit EXIT
  trap 'log "failed: line $LINENO: $BASH_COMMAND"' ERR
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local sub=${1:-help}
  [[ $# -gt 0 ]] && shift
  case $sub in
    install) cmd_install ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    import) cmd_import "$@" ;;
    stop-kubelet) stop_proc kubelet ;;
    start-kubelet) start_kubelet ;;
    restart-apiserver) stop_proc kube-apiserver; start_apiserver; T_UP=$SECONDS; wait_for kube-apiserver 90 apiserver_ready ;;
    pause-apiserver) signal_proc kube-apiserver STOP ;;
    resume-apiserver) signal_proc kube-apiserver CONT ;;
    nsenter) in_netns "$@" ;;
    help | -h | --help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
