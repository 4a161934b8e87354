#!/usr/bin/env bash
# CI: the stack in containers. Installs docker.io and docker-compose (and wget) if missing, starts dockerd the way that
# works on these machines (no iptables, no bridge, vfs storage) if no daemon answers, builds the local images
# from the host's binaries, then:
#   1. docker-compose.multiregion.yml up, the smoke check (a decision per region, a budget PATCH seen by every
#      agent), down -v;
#   2. npm start with its servers in containers (QP_STACK_SERVERS=docker), the same smoke check, SIGTERM, and
#      no container or port left.
# Leaves dockerd running for the containers test run that follows (.ci/run), and writes its pid to
# $QP_CI_DOCKERD_PID_FILE when it started one. Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/../.."

say() { printf -- '-- %s\n' "$*"; }
fail() { printf -- '-- FAILED: %s\n' "$*"; exit 1; }

export REDIS_IMAGE=local/redis:7 NATS_IMAGE=local/nats:2 QP_IMAGE=local/quotaplane:dev
work=$(mktemp -d "${TMPDIR:-/tmp}/qp-ci-docker-XXXXXX")

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
# The local NATS image carries the host's wget for its healthcheck.
command -v wget >/dev/null 2>&1 || missing+=(wget)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq "${missing[@]}"; } >"$work/apt.log" 2>&1 ||
    { tail -20 "$work/apt.log"; fail "could not install ${missing[*]}"; }
fi
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi

if ! docker info >/dev/null 2>&1; then
  say 'starting dockerd'
  dockerd --iptables=false --bridge=none --storage-driver=vfs >"$work/dockerd.log" 2>&1 &
  dockerd_pid=$!
  [ -n "${QP_CI_DOCKERD_PID_FILE:-}" ] && echo "$dockerd_pid" >"$QP_CI_DOCKERD_PID_FILE"
  for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log"; fail 'dockerd did not start'; }
fi

say 'building local images from the host binaries'
timeout 600 docker/build-local-images.sh || fail 'building the local images'

# Ports off the defaults, so nothing a developer runs on this machine is in the way, and below the kernel's
# ephemeral range (32768 and up) with the eu cluster's bus ports (port + 10000) too: at 27121-27123 a bus port
# fell in that range and was once taken by some connection's local end.
export QP_STACK_HOST=127.0.0.1 QP_STACK_COORDINATOR_PORT=17100 QP_STACK_US_PORT=17101 QP_STACK_EU_PORT=17102 \
  QP_STACK_AP_PORT=17103 QP_STACK_NATS_PORT=17110 QP_STACK_NATS_MONITOR_PORT=17119 QP_STACK_US_REDIS_PORT=17111 \
  QP_STACK_EU_REDIS_PORT=17121 QP_STACK_AP_REDIS_PORT=17131 QP_STACK_US_GRPC_PORT=17141 \
  QP_STACK_EU_GRPC_PORT=17142 QP_STACK_AP_GRPC_PORT=17143 QP_STACK_READY_TIMEOUT_MS=180000
QP_ADMIN_TOKEN=$(node -e 'console.log(require("node:crypto").randomBytes(24).toString("hex"))')
export QP_ADMIN_TOKEN
project=qpci$$
file=docker-compose.multiregion.yml

say "compose: up ($file, project $project)"
compose_status=0
if timeout 300 "${compose[@]}" -p "$project" -f "$file" up -d; then
  timeout 300 node --import tsx scripts/stack-smoke.ts || compose_status=1
else
  compose_status=1
fi
if [ $compose_status -ne 0 ]; then
  "${compose[@]}" -p "$project" -f "$file" ps
  "${compose[@]}" -p "$project" -f "$file" logs --tail 40
fi
say 'compose: down'
timeout 120 "${compose[@]}" -p "$project" -f "$file" down -v --timeout 20 || compose_status=1
left=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
[ -z "$left" ] || { echo "containers left: $left"; compose_status=1; }
[ $compose_status -eq 0 ] || fail 'the compose stack'

say 'npm start with its servers in containers'
state=$work/stack.json
QP_STACK_SERVERS=docker QP_STACK_STATE_FILE=$state QP_STACK_ENV_FILE=$work/stack.env QP_STACK_CLUSTER_REGIONS=eu \
  node --import tsx scripts/stack.ts >"$work/stack.log" 2>&1 &
stack_pid=$!
for _ in $(seq 1 360); do
  [ -f "$state" ] && break
  kill -0 "$stack_pid" 2>/dev/null || break
  sleep 0.5
done
launcher_status=0
if [ -f "$state" ]; then
  timeout 300 node --import tsx scripts/stack-smoke.ts || launcher_status=1
else
  launcher_status=1
fi
kill -TERM "$stack_pid" 2>/dev/null
wait "$stack_pid" || launcher_status=1
cat "$work/stack.log"
left=$(docker ps -aq --filter 'label=org.quotaplane.stack')
[ -z "$left" ] || { echo "containers left: $left"; launcher_status=1; }
for port in 17100 17101 17102 17103 17110 17111 17121 17122 17123 17131 17141 17142 17143; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "port $port still answers"; launcher_status=1; fi
done
[ $launcher_status -eq 0 ] || fail 'npm start with containers'

rm -rf "$work"
say 'docker stack checks passed'
