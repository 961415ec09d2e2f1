#!/usr/bin/env bash
# hack/lib.sh — shell helpers shared by hack/setup.sh, control-plane.sh, node.sh and images.sh:
# apt installs, the machine's Debian archive, locks, and processes started detached with their
# PID, binary and start time recorded so that they are stopped by PID only (never by name) and
# a reused PID is never mistaken for ours.
#
# The sourcing script sets LOG_TAG (the prefix of its messages), STATE_DIR (where PID files
# go), CACHE_DIR (logs of apt), and may set START_PREFIX (an array: a command that the started
# binary is exec-ed through, such as nsenter into a network namespace).

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }

# Run a command as root (directly, or through non-interactive sudo).
as_root() {
  if [[ $EUID -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo -n "$@" || die "needs root for: $* (sudo -n failed; run once as root, or provide the binaries via KUBEBUILDER_ASSETS)"
  else
    die "needs root for: $* (no sudo; provide the binaries via KUBEBUILDER_ASSETS instead)"
  fi
}

is_debian() { [[ -r /etc/debian_version ]] && command -v apt-get >/dev/null 2>&1; }

APT_UPDATED=0
APT_LOG=$CACHE_DIR/apt.log

apt_update() {
  [[ $APT_UPDATED -eq 1 ]] && return 0
  log "apt-get update"
  mkdir -p "$CACHE_DIR"
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get update >>"$APT_LOG" 2>&1; then
    tail -n 20 "$APT_LOG" >&2 || true
    die "apt-get update failed (log: $APT_LOG)"
  fi
  APT_UPDATED=1
}

# apt_install PKG... — install; on failure refresh the package lists once and retry.
apt_install() {
  is_debian || die "cannot install $* automatically: not a Debian system (set KUBEBUILDER_ASSETS to a folder with kube-apiserver and etcd, e.g. from setup-envtest)"
  mkdir -p "$CACHE_DIR"
  local pkg missing_candidate=0
  for pkg in "$@"; do
    if ! apt-cache policy "$pkg" 2>/dev/null | grep 'Candidate: [^(]' >/dev/null; then missing_candidate=1; fi
  done
  [[ $missing_candidate -eq 1 ]] && apt_update
  log "apt-get install $*"
  local -a cmd=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@")
  if ! as_root "${cmd[@]}" >>"$APT_LOG" 2>&1; then
    if [[ $APT_UPDATED -eq 0 ]]; then
      apt_update
      as_root "${cmd[@]}" >>"$APT_LOG" 2>&1 && return 0
    fi
    tail -n 20 "$APT_LOG" >&2 || true
    die "apt-get install $* failed (log: $APT_LOG)"
  fi
}

# The Debian archive this machine's apt already uses for its release (not the security
# archive): from the deb822 files in /etc/apt/sources.list.d/, else the one-line lists. No
# host is written into the project: with none configured, it stops and says what to configure.
debian_archive_uri() {
  local codename uri
  codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null | tr -d '"')
  codename=${codename:-bookworm}
  # deb822: one stanza a paragraph; the first of Types deb whose Suites name the release.
  uri=$(awk -v rel="$codename" 'BEGIN {RS = ""}
    / *Types:[^\n]*[[:space:]]deb([[:space:]]|$)/ && $0 ~ ("Suites:[^\n]*[[:space:]]" rel "([[:space:]]|$)") {
      if (match($0, /URIs:[[:space:]]*[^[:space:]]+/)) {
        u = substr($0, RSTART, RLENGTH); sub(/URIs:[[:space:]]*/, "", u)
        if (u !~ /security/) {print u; exit}
      }
    }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [[ -n $uri ]] || uri=$(awk -v rel="$codename" '$1 == "deb" && $3 == rel && $2 !~ /security/ {print $2; exit}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
  [[ -n $uri ]] || die "no Debian package source for $codename is configured: add the archive this machine should use to /etc/apt/sources.list.d/debian.sources (Types: deb, URIs: <archive>, Suites: $codename, Components: main, Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg) or a 'deb <archive> $codename main' line to /etc/apt/sources.list, then run apt-get update"
  echo "$uri"
}

# Installed, not merely known to dpkg (a removed package keeps its config files, and `dpkg -s`
# still succeeds for it).
pkg_installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }

ensure_tool() { # ensure_tool COMMAND DEBIAN-PACKAGE
  command -v "$1" >/dev/null 2>&1 && return 0
  apt_install "$2"
  command -v "$1" >/dev/null 2>&1 || die "$1 still missing after installing $2"
}

# Create the lock file's directory and take an exclusive lock on file descriptor $2.
# The descriptor is closed in every process this script starts, so servers never hold it.
take_lock() { # take_lock FILE FD WHAT
  mkdir -p "$(dirname "$1")"
  eval "exec $2>>\"\$1\""
  if ! flock -n "$2"; then
    log "waiting for another '$3' holding $1 ..."
    flock -w 1800 "$2" || die "timed out waiting for lock $1"
  fi
}

# Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat), to detect PID reuse.
proc_starttime() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }                 # drop "pid (comm) " — comm may contain spaces
  awk '{print $20}' <<<"$stat"      # field 22 overall = field 20 after pid and comm
}

proc_state() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  echo "${stat%% *}"
}

# True if the process recorded for NAME is alive and is still the binary we started.
proc_is_ours() { # NAME
  local name=$1 pid exe want start want_start
  [[ -f $STATE_DIR/$name.pid && -f $STATE_DIR/$name.exe && -f $STATE_DIR/$name.start ]] || return 1
  pid=$(<"$STATE_DIR/$name.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -d /proc/$pid ]] || return 1
  [[ $(proc_state "$pid" || echo X) != Z ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=${exe% (deleted)}
  want=$(<"$STATE_DIR/$name.exe")
  [[ $exe == "$want" ]] || return 1
  start=$(proc_starttime "$pid") || return 1
  want_start=$(<"$STATE_DIR/$name.start")
  [[ $start == "$want_start" ]]
}

# start_proc NAME BINARY ARGS... — detached in its own session, output to NAME.log, PID to NAME.pid.
start_proc() {
  local name=$1 bin=$2
  shift 2
  local pidfile=$STATE_DIR/$name.pid logf=$STATE_DIR/$name.log
  rm -f "$pidfile"
  printf '%s\n' "$bin" >"$STATE_DIR/$name.exe"
  { printf '== %s: %q' "$(date -u +%FT%TZ)" "$bin"; printf ' %q' "$@"; printf '\n'; } >>"$logf"
  # The inner shell writes its own PID and then execs the server, so the PID file holds exactly
  # the server's PID whether or not setsid had to fork. SIGHUP stays ignored (like nohup).
  # Every inherited descriptor above 2 is closed (our lock files, a caller's pipes), so the
  # servers never hold our locks or keep a caller waiting for EOF.
  # shellcheck disable=SC2016
  setsid bash -c '
    for fd in /proc/$$/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0"
    trap "" HUP
    exec "$@"' "$pidfile" ${START_PREFIX[@]+"${START_PREFIX[@]}"} "$bin" "$@" </dev/null >>"$logf" 2>&1 &
  local i pid
  for ((i = 0; i < 100; i++)); do
    [[ -s $pidfile ]] && break
    sleep 0.05
  done
  [[ -s $pidfile ]] || die "$name did not start (log: $logf)"
  pid=$(<"$pidfile")
  # Wait until the exec has happened, then record the start time.
  for ((i = 0; i < 100; i++)); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null || true) == "$bin" ]] && break
    [[ -d /proc/$pid ]] || break
    sleep 0.05
  done
  if [[ $(readlink "/proc/$pid/exe" 2>/dev/null || true) != "$bin" ]]; then
    log "---- last 30 lines of $logf ----"; tail -n 30 "$logf" >&2 || true
    die "$name (pid $pid) exited immediately or is not $bin"
  fi
  proc_starttime "$pid" >"$STATE_DIR/$name.start"
  log "started $name (pid $pid, log $logf)"
}

# stop_proc NAME [GRACE] — TERM, then KILL after GRACE tenths of a second (default 150: 15 s);
# only if the PID is still our binary.
stop_proc() {
  local name=$1 grace=${2:-150} pid i
  [[ -f $STATE_DIR/$name.pid ]] || return 0
  pid=$(<"$STATE_DIR/$name.pid")
  if ! proc_is_ours "$name"; then
    log "$name: pid ${pid:-?} is not running (or is no longer $name); nothing to stop"
    rm -f "$STATE_DIR/$name.pid"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace; i++)); do
    proc_is_ours "$name" || break
    sleep 0.1
  done
  if proc_is_ours "$name"; then
    log "$name (pid $pid) ignored SIGTERM for $((grace / 10))s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      proc_is_ours "$name" || break
      sleep 0.1
    done
  fi
  proc_is_ours "$name" && die "$name (pid $pid) is still running"
  rm -f "$STATE_DIR/$name.pid"
  log "stopped $name (pid $pid)"
}


# read_state KEY — the value of KEY in $STATE_DIR/state (KEY=VALUE lines an `up` wrote);
# status 1 when there is none.
read_state() {
  [[ -f $STATE_DIR/state ]] || return 1
  local k v
  while IFS='=' read -r k v; do
    [[ $k == "$1" ]] && { echo "$v"; return 0; }
  done <"$STATE_DIR/state"
  return 1
}

port_in_use() { # something accepts connections on 127.0.0.1:PORT
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# choose_port VALUE-FROM-ENV DEFAULT NAME TAKEN... — prints the port to use.
choose_port() {
  local explicit=$1 default=$2 name=$3 p
  shift 3
  if [[ -n $explicit ]]; then
    [[ $explicit =~ ^[0-9]+$ ]] || die "$name port '$explicit' is not a number"
    if port_in_use "$explicit"; then
      die "$name port $explicit (set explicitly) is already in use on 127.0.0.1; free it or choose another"
    fi
    echo "$explicit"; return
  fi
  for ((p = default; p < default + 200; p++)); do
    [[ " $* " == *" $p "* ]] && continue
    if ! port_in_use "$p"; then
      [[ $p -ne $default ]] && log "default $name port $default is busy or already chosen; using $p"
      echo "$p"; return
    fi
  done
  die "no free $name port in $default..$((default + 199))"
}


# gen_webhook_client PKI-DIR STATE-DIR — the API server's identity towards admission webhooks,
# as a cluster that authenticates itself to them configures it: a CA of its own (only this
# certificate is signed by it, so a webhook trusting it trusts the API server alone), a client
# certificate, the kubeconfig naming it for every webhook host ("*"), and the
# AdmissionConfiguration for --admission-control-config-file. baton's webhook is given the CA
# (--webhook-client-ca-file, the chart's webhook.clientCA) and reads nothing from anyone else.
gen_webhook_client() {
  local pki=$1 dir=$2
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
    -keyout "$pki/webhook-client-ca.key" -out "$pki/webhook-client-ca.crt" -subj "/CN=webhook-client-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
  openssl req -new -newkey rsa:2048 -nodes -sha256 -keyout "$pki/webhook-client.key" \
    -out "$pki/webhook-client.csr" -subj "/CN=kube-apiserver-webhook-client"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth" >"$pki/webhook-client.ext"
  openssl x509 -req -sha256 -days 365 -in "$pki/webhook-client.csr" -CA "$pki/webhook-client-ca.crt" \
    -CAkey "$pki/webhook-client-ca.key" -CAcreateserial -out "$pki/webhook-client.crt" \
    -extfile "$pki/webhook-client.ext"
  chmod 600 "$pki"/webhook-client*.key
  cat >"$dir/webhook-client.kubeconfig" <<EOF
apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: $pki/webhook-client.crt
    client-key: $pki/webhook-client.key
EOF
  cat >"$dir/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $dir/webhook-client.kubeconfig
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $dir/webhook-client.kubeconfig
EOF
}
