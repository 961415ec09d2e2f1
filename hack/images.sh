#!/usr/bin/env bash
# hack/images.sh — the node's container images, made without any registry, as OCI archives in
# $BATON_CACHE_DIR/images/ (hack/node.sh imports every archive there into the node's containerd).
#
#   hack/images.sh pause     registry.k8s.io/pause:3.2, compiled from the Kubernetes source's pause.c
#   hack/images.sh debian    docker.io/library/debian:bookworm-slim, made by mmdebstrap (minbase)
#   hack/images.sh baton     docker.io/library/baton:dev from the project's Dockerfile, stage
#                            `prebuilt`: the runtime stage with binaries built on this host
#                            (target/image/); the `build` stage needs a rust image, which
#                            no registry here serves. Also tagged baton:next (a "new version"
#                            for the rollout tests: the same bits under another name).
#                            With it, baton-exec (the executor), linked statically.
#   hack/images.sh busybox   docker.io/library/busybox:baton, Debian's static busybox alone
#                            (no libc, no baton): a plain user image for the tools container
#   hack/images.sh agents    docker.io/library/baton-agents:py from tests/agents/Containerfile: a
#                            user's agent image for "bring your own agent" (Debian's Python, the
#                            frameworks pinned in tests/agents/requirements.txt from PyPI, the
#                            agents' scripts in /opt/agents/app/); rebuilt when one of those changes
#   hack/images.sh all       all five
#   hack/images.sh previous  docker.io/library/baton:previous, the release named in
#                            hack/previous-release, built from its commit in the repository's
#                            own history (offline) as `baton` builds this tree's; its source,
#                            chart and binaries (bin/) kept in $BATON_CACHE_DIR/previous/<commit>/
#                            for the upgrade lane (tests/node_upgrade.rs) and the mixed-version
#                            tests (tests/controller/versions.rs). `make test` builds it; the
#                            demo does not.
#
# podman builds with --pull=never: a FROM that is not already local fails instead of pulling.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HACK")
CACHE_DIR=${BATON_CACHE_DIR:-${HOME:?HOME is not set}/.cache/baton}
IMAGES=$CACHE_DIR/images
STATE_DIR=$IMAGES
LOG_TAG=images
# shellcheck source=hack/lib.sh
source "$HACK/lib.sh"

readonly PAUSE=registry.k8s.io/pause:3.2
readonly DEBIAN=docker.io/library/debian:bookworm-slim
readonly BATON=docker.io/library/baton:dev
readonly BATON_NEXT=docker.io/library/baton:next
readonly BUSYBOX=docker.io/library/busybox:baton
readonly BATON_PREVIOUS=docker.io/library/baton:previous
readonly AGENTS=docker.io/library/baton-agents:py

mkdir -p "$IMAGES"

save() { # IMAGE ARCHIVE — podman's OCI archive keeps the name, which containerd's import uses
  rm -f "$2.tmp"
  podman save -q --format oci-archive -o "$2.tmp" "$1" >/dev/null
  mv -f "$2.tmp" "$2"
}

image_pause() {
  local out=$IMAGES/pause.oci.tar
  [[ -f $out ]] && return 0
  local src=$CACHE_DIR/k8s-1.20/pause.c work
  [[ -f $src ]] || die "no $src: run hack/node.sh install first (it builds the server binaries)"
  work=$(mktemp -d)
  gcc -static -O2 -DVERSION=v3.2-baton -o "$work/pause" "$src"
  strip "$work/pause"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$work/Containerfile"
  podman build -q --pull=never -t "$PAUSE" -f "$work/Containerfile" "$work" >/dev/null
  save "$PAUSE" "$out"
  rm -rf "$work"
  log "pause image: $out"
}

image_debian() {
  local out=$IMAGES/debian.oci.tar
  [[ -f $out ]] && { podman image exists "$DEBIAN" || podman load -q -i "$out" >/dev/null; return 0; }
  local work archive t0=$SECONDS
  archive=$(debian_archive_uri)
  work=$(mktemp -d)
  log "debian base: mmdebstrap --variant=minbase bookworm (about 80 s)"
  # As Debian's own slim images: no documentation, man pages or translations, no apt caches.
  # The hook's "$1" is the rootfs, expanded by mmdebstrap when it runs the hook, not here.
  # shellcheck disable=SC2016
  mmdebstrap --quiet --variant=minbase --include=ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* "$1"/var/log/*.log' \
    bookworm "$work/rootfs.tar" "$archive" \
    >"$work/mmdebstrap.log" 2>&1 || { tail -n 20 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  podman import -q "$work/rootfs.tar" "$DEBIAN" >/dev/null
  save "$DEBIAN" "$out"
  rm -rf "$work"
  log "debian base: $out ($((SECONDS - t0))s)"
}

# The binaries an image's prebuilt stage copies, built from the source tree SRC (this tree, or
# the previous release's) in this tree's target directory (or CARGO_TARGET_DIR, where CI keeps
# one between runs) and installed in SRC/target/image/.
release_binaries() {
  local src=$1 triple target=${CARGO_TARGET_DIR:-$ROOT/target}
  (cd "$src" && CARGO_TARGET_DIR=$target cargo build --release --locked --bin baton --bin kubectl-baton)
  # The executor runs in images without baton's libc: linked statically. The triple is named
  # so that crt-static applies to it and not to build scripts (as the Dockerfile does).
  triple=$(rustc -vV | sed -n 's/^host: //p')
  (cd "$src" && CARGO_TARGET_DIR=$target RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p baton-exec --target "$triple")
  mkdir -p "$src/target/image"
  install -m 0755 "$target/release/baton" "$target/release/kubectl-baton" "$src/target/image/"
  install -m 0755 "$target/$triple/release/baton-exec" "$src/target/image/"
}

image_baton() {
  image_debian
  local t0=$SECONDS
  log "baton: cargo build --release (the binaries the image's prebuilt stage copies)"
  release_binaries "$ROOT"
  log "baton: podman build --target prebuilt (Dockerfile)"
  podman build -q --pull=never --network=host --target prebuilt -t "$BATON" -f "$ROOT/Dockerfile" "$ROOT" >/dev/null
  podman tag "$BATON" "$BATON_NEXT"
  save "$BATON" "$IMAGES/baton.oci.tar"
  save "$BATON_NEXT" "$IMAGES/baton-next.oci.tar"
  log "baton: $(podman image inspect --format '{{.Size}}' "$BATON" | awk '{printf "%.1f MB", $1/1e6}') ($((SECONDS - t0))s)"
}

# The release the upgrade lane starts from: its source unpacked from the commit
# hack/previous-release names, its binaries built in this tree's target directory (the
# dependencies the two share are compiled once; the old crate's own units live beside the
# new ones, under another hash), its image from its own Dockerfile. The archive is kept with
# the commit it was built from, and rebuilt when hack/previous-release names another.
image_previous() {
  image_debian
  local version commit
  # shellcheck source=hack/previous-release
  source "$HACK/previous-release"
  [[ ${commit:-} =~ ^[0-9a-f]{40}$ ]] || die "hack/previous-release: commit '${commit:-}' is not a full commit hash"
  local out=$IMAGES/baton-previous.oci.tar stamp=$IMAGES/baton-previous.commit
  if [[ -f $out && -x $CACHE_DIR/previous/$commit/bin/baton && $(cat "$stamp" 2>/dev/null) == "$commit" ]]; then
    podman image exists "$BATON_PREVIOUS" || podman load -q -i "$out" >/dev/null
    return 0
  fi
  git -C "$ROOT" cat-file -e "$commit^{commit}" 2>/dev/null ||
    die "commit $commit (hack/previous-release, $version) is not in this clone's history: a shallow clone? (git fetch --unshallow)"
  local src=$CACHE_DIR/previous/$commit t0=$SECONDS
  rm -rf "$src"
  mkdir -p "$src"
  git -C "$ROOT" archive "$commit" | tar -x -C "$src"
  log "baton $version ($commit): cargo build --release in $src"
  release_binaries "$src"
  # The shared target directory's binaries are this tree's again (both builds are fresh:
  # cargo only links them back into place).
  release_binaries "$ROOT"
  podman build -q --pull=never --network=host --target prebuilt -t "$BATON_PREVIOUS" -f "$src/Dockerfile" "$src" >/dev/null
  # Its binaries stay beside its source: the bed's mixed-version tests run its controller
  # (tests/controller/versions.rs).
  rm -rf "${src:?}/bin"
  mv "$src/target/image" "$src/bin"
  rm -rf "$src/target"
  save "$BATON_PREVIOUS" "$out"
  echo "$commit" >"$stamp"
  log "baton $version: $out ($((SECONDS - t0))s)"
}

image_busybox() {
  local out=$IMAGES/busybox.oci.tar
  [[ -f $out ]] && return 0
  local work bin
  bin=$(command -v busybox) || die "no busybox: hack/setup.sh installs busybox-static"
  file -L "$bin" | grep -q 'statically linked' || die "$bin is not statically linked (install busybox-static)"
  work=$(mktemp -d)
  cp "$bin" "$work/busybox"
  # /bin/sh and the usual commands as links to the one binary; nothing else in the image.
  printf 'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\nUSER 65534:65534\n' >"$work/Containerfile"
  podman build -q --pull=never -t "$BUSYBOX" -f "$work/Containerfile" "$work" >/dev/null
  save "$BUSYBOX" "$out"
  rm -rf "$work"
  log "busybox image: $out"
}

# A user's agent image (tests/agents/), built as a team would build theirs: from a Containerfile
# beside the agents, not generated here, so that it reads as the example it is. It is kept while
# the hash over everything it is built from (the Containerfile, the pins, the scripts) is the
# one it was built with: a new pin or an edited agent rebuilds it; nothing else does.
image_agents() {
  image_debian
  local dir=$ROOT/tests/agents out=$IMAGES/agents.oci.tar stamp=$IMAGES/agents.sha256 sum t0=$SECONDS
  sum=$(cd "$dir" && sha256sum Containerfile requirements.txt ./*.py | sha256sum | cut -d' ' -f1)
  if [[ -f $out && $(cat "$stamp" 2>/dev/null) == "$sum" ]]; then
    podman image exists "$AGENTS" || podman load -q -i "$out" >/dev/null
    return 0
  fi
  log "agents: podman build (tests/agents/Containerfile: Debian's python3, pip install -r requirements.txt)"
  # --network=host: apt-get and pip fetch from the machine's package sources, with the trust
  # of the machine: its CA bundle stands in for the image's during the build (Debian's pip
  # verifies with that file), as a machine whose egress re-signs TLS needs. A build mount
  # only: the image keeps Debian's own bundle.
  local -a trust=()
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] &&
    trust=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  podman build -q --pull=never --network=host ${trust[@]+"${trust[@]}"} \
    -t "$AGENTS" -f "$dir/Containerfile" "$dir" >/dev/null
  save "$AGENTS" "$out"
  echo "$sum" >"$stamp"
  log "agents: $(podman image inspect --format '{{.Size}}' "$AGENTS" | awk '{printf "%.1f MB", $1/1e6}') ($((SECONDS - t0))s)"
}

case ${1:-help} in
  pause) image_pause ;;
  debian) image_debian ;;
  baton) image_baton ;;
  busybox) image_busybox ;;
  agents) image_agents ;;
  all) image_pause; image_debian; image_baton; image_busybox; image_agents ;;
  previous) image_previous ;;
  *) sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; [[ ${1:-help} == help ]] ;;
esac
