#!/usr/bin/env bash
# Make a Python 3.11 base image without any container registry: debootstrap a minimal
# Debian bookworm with python3 and load it into the Docker engine, then copy it to an OCI layout
# (for the daemonless backend) and, when a local registry answers, into it (for podman and buildah).
# The rootfs tarball is cached outside the repo so later runs only import it.
set -euo pipefail
IMAGE="${1:-mbuild-local/python:3.11-bookworm}"
CACHE="${MBUILD_CI_CACHE:-$HOME/.cache/mbuild-ci}"
TARBALL="$CACHE/python3.11-bookworm-rootfs-v2.tar"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

OCI_DIR="${MBUILD_TEST_BASE_OCI_DIR:-$CACHE/base-oci-v2}"
REGISTRY="${MBUILD_TEST_REGISTRY:-}"
mkdir -p "$CACHE"
if [ ! -s "$TARBALL" ]; then
  ROOT="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
  echo "debootstrap bookworm into $ROOT (about 2 minutes)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$ROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log"; exit 1; }
  # Drop what an image never needs: apt lists, caches, docs.
  rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/usr/share/doc/* \
    "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/*
  chmod 755 "$ROOT"  # mktemp made it 0700; as the image's / it would lock out non-root users under runc
  tar -C "$ROOT" --numeric-owner -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  rm -rf "$ROOT"
fi
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    -c 'CMD ["python3"]' "$TARBALL" "$IMAGE" >/dev/null
  echo "base image $IMAGE imported from $TARBALL"
fi
if command -v skopeo >/dev/null; then
  DAEMON=()
  [ -n "${DOCKER_HOST:-}" ] && DAEMON=(--src-daemon-host "$DOCKER_HOST")
  if [ ! -f "$OCI_DIR/index.json" ]; then
    skopeo copy -q "${DAEMON[@]}" "docker-daemon:$IMAGE" "oci:$OCI_DIR:bookworm"
    echo "base image copied to oci:$OCI_DIR:bookworm"
  fi
  if [ -n "$REGISTRY" ]; then
    skopeo copy -q --dest-tls-verify=false "oci:$OCI_DIR:bookworm" "docker://$REGISTRY/$IMAGE"
    echo "base image pushed to $REGISTRY/$IMAGE"
  fi
fi
