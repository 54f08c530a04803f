#!/usr/bin/env bash
# Start a Docker engine for the integration tests unless one already answers.
# No bridge or iptables here: builds and containers use the host network.
set -euo pipefail
STATE="${MBUILD_CI_DOCKER:-/tmp/mbuild-ci-docker}"
SOCK="$STATE/docker.sock"
export DOCKER_HOST="unix://$SOCK"
if docker info >/dev/null 2>&1; then echo "dockerd already running at $SOCK"; exit 0; fi
mkdir -p "$STATE"
# A stale nsfs mount from an earlier engine blocks a new exec root.
grep -o " $STATE/exec[^ ]*" /proc/mounts | xargs -r -n1 umount 2>/dev/null || true
nohup dockerd --iptables=false --ip-masq=false --bridge=none --storage-driver=overlay2 \
  --data-root="${MBUILD_CI_DOCKER_DATA:-/var/lib/mbuild-ci-docker}" --exec-root="$STATE/exec" \
  --pidfile="$STATE/dockerd.pid" -H "unix://$SOCK" >"$STATE/dockerd.log" 2>&1 &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && { echo "dockerd started at $SOCK"; exit 0; }
  sleep 1
done
tail -20 "$STATE/dockerd.log"; exit 1
