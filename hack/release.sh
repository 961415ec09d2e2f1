#!/usr/bin/env bash
# hack/release.sh — baton's releases (`make release VERSION=0.y.z`).
#
#   hack/release.sh check      the versions the tree names agree: the crates (Cargo.toml,
#                              exec/Cargo.toml), the chart's version and appVersion, and a
#                              CHANGELOG.md section for that version (`make lint` runs this)
#   hack/release.sh VERSION    from a clean tree whose versions are VERSION and whose
#                              CHANGELOG.md section for it is dated: the image (hack/images.sh
#                              baton, tagged baton:VERSION, saved as dist/baton-VERSION.oci.tar)
#                              and the chart at VERSION with that image as its default
#                              (dist/baton-VERSION.tgz), and their SHA-256 sums
#
# Versions are 0.y.z while the API is v1alpha1: y moves when an upgrade needs an order or a
# step (a ledger format, a CRD field the protocol reads, a flag the chart passes), z otherwise.
# The release the upgrade lane starts from is named in hack/previous-release.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HACK")
CACHE_DIR=${BATON_CACHE_DIR:-${HOME:?HOME is not set}/.cache/baton}
STATE_DIR=$CACHE_DIR
LOG_TAG=release
# shellcheck source=hack/lib.sh
source "$HACK/lib.sh"

crate_version() { sed -n 's/^version = "\(.*\)"$/\1/p' "$1" | head -1; }
chart_field() { sed -n "s/^$1: \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$ROOT/charts/baton/Chart.yaml"; }

# Prints the version every file agrees on; dies naming the first that does not.
agreed_version() {
  local version
  version=$(crate_version "$ROOT/Cargo.toml")
  [[ $version =~ ^0\.[0-9]+\.[0-9]+$ ]] || die "Cargo.toml: version $version is not 0.y.z (the API is v1alpha1)"
  local exec chart app
  exec=$(crate_version "$ROOT/exec/Cargo.toml")
  chart=$(chart_field version)
  app=$(chart_field appVersion)
  [[ $exec == "$version" ]] || die "exec/Cargo.toml: version $exec, Cargo.toml says $version"
  [[ $chart == "$version" ]] || die "charts/baton/Chart.yaml: version $chart, Cargo.toml says $version"
  [[ $app == "$version" ]] || die "charts/baton/Chart.yaml: appVersion $app, Cargo.toml says $version"
  grep -q "^## $version\b" "$ROOT/CHANGELOG.md" || die "CHANGELOG.md: no section '## $version'"
  echo "$version"
}

release() {
  local version=$1 agreed
  agreed=$(agreed_version)
  [[ $agreed == "$version" ]] || die "the tree names version $agreed, not $version: bump Cargo.toml, exec/Cargo.toml and the chart first"
  grep -Eq "^## $version — [0-9]{4}-[0-9]{2}-[0-9]{2}$" "$ROOT/CHANGELOG.md" ||
    die "CHANGELOG.md: date the section: '## $version — YYYY-MM-DD'"
  [[ -z $(git -C "$ROOT" status --porcelain) ]] || die "the tree has uncommitted changes"
  local dist=$ROOT/dist
  mkdir -p "$dist"
  bash "$HACK/images.sh" baton
  podman tag docker.io/library/baton:dev "docker.io/library/baton:$version"
  podman save -q --format oci-archive -o "$dist/baton-$version.oci.tar" "docker.io/library/baton:$version"
  # The chart's default image is the release's own; everything else as in the tree.
  local work
  work=$(mktemp -d)
  cp -r "$ROOT/charts/baton" "$work/baton"
  sed -i "s/^  tag: dev$/  tag: \"$version\"/" "$work/baton/values.yaml"
  grep -q "^  tag: \"$version\"$" "$work/baton/values.yaml" || die "charts/baton/values.yaml: no 'image.tag: dev' to set"
  python3 - "$work/baton" "$dist" "$version" <<'PY'
import sys
import helm_python as helm
print(helm.package(sys.argv[1], destination=sys.argv[2], version=sys.argv[3], app_version=sys.argv[3]))
PY
  rm -rf "$work"
  (cd "$dist" && sha256sum "baton-$version.oci.tar" "baton-$version.tgz" | tee "baton-$version.sha256")
  log "release $version: dist/baton-$version.oci.tar (load it into your cluster's runtime), dist/baton-$version.tgz (helm install baton dist/baton-$version.tgz)"
}

case ${1:-} in
  check) log "versions agree: $(agreed_version)" ;;
  '' | -h | --help) sed -n '2,16p' "$0" ;;
  *) release "$1" ;;
esac
