#!/usr/bin/env bash
# The tests' Python base image, made with no container registry the way a user on an air-gapped host makes
# one: `mbuild base` (mmdebstrap or debootstrap from the Debian mirror, a reproducible OCI layout), then
# `mbuild load` into the Docker engine, a copy of the layout for the daemonless backend and, when a local
# registry answers, a push into it (for podman and buildah). The layout is cached outside the repo
# (MBUILD_CI_CACHE), so later runs skip the mirror.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${1:-mbuild-local/python:3.11-bookworm}"
CACHE="${MBUILD_CI_CACHE:-$HOME/.cache/mbuild-ci}"
OCI_DIR="${MBUILD_TEST_BASE_OCI_DIR:-$CACHE/base-oci-v3}"
REGISTRY="${MBUILD_TEST_REGISTRY:-}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$CACHE"

echo "mbuild base from $MIRROR (about 2 minutes the first time, cached in $CACHE/mbuild)"
BASE="$(MBUILD_CACHE="$CACHE/mbuild" .venv/bin/mbuild base --mirror "$MIRROR")"
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  .venv/bin/mbuild load "$BASE" --into docker --tag "$IMAGE" >/dev/null
  echo "base image $IMAGE loaded into docker from $BASE"
fi
if [ ! -f "$OCI_DIR/index.json" ]; then
  skopeo copy -q "$BASE" "oci:$OCI_DIR:bookworm"
  echo "base image copied to oci:$OCI_DIR:bookworm"
fi
if [ -n "$REGISTRY" ]; then
  skopeo copy -q --dest-tls-verify=false "oci:$OCI_DIR:bookworm" "docker://$REGISTRY/$IMAGE"
  echo "base image pushed to $REGISTRY/$IMAGE"
fi
