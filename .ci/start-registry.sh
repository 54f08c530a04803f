#!/usr/bin/env bash
# Start a local OCI distribution registry on 127.0.0.1:5000 (plain HTTP, loopback only) unless one answers.
set -euo pipefail
ADDR="${MBUILD_TEST_REGISTRY:-127.0.0.1:5000}"
STATE="${MBUILD_CI_REGISTRY:-/tmp/mbuild-ci-registry}"
if curl -fs "http://$ADDR/v2/" >/dev/null 2>&1; then echo "registry already answers at $ADDR"; exit 0; fi
mkdir -p "$STATE/data"
cat >"$STATE/config.yml" <<CONFIG
version: 0.1
storage:
  filesystem:
    rootdirectory: $STATE/data
  delete:
    enabled: true
http:
  addr: $ADDR
log:
  level: warn
CONFIG
nohup docker-registry serve "$STATE/config.yml" >"$STATE/registry.log" 2>&1 &
echo $! >"$STATE/registry.pid"
for _ in $(seq 1 30); do
  curl -fs "http://$ADDR/v2/" >/dev/null 2>&1 && { echo "registry started at $ADDR"; exit 0; }
  sleep 0.5
done
tail -20 "$STATE/registry.log"; exit 1
