#!/usr/bin/env bash
# Build the stack's images from this machine's own binaries, for machines that reach no image registry:
#   local/redis:7           redis-server and redis-cli (healthchecks), with exactly the libraries they link
#   local/nats:2            nats-server and wget (healthchecks)
#   local/quotaplane:dev    node, the compiled services (docker/tsconfig.build.json) and production dependencies
# Each image is a root filesystem assembled here and imported (`docker import`): no base image is pulled.
# Use them with docker-compose.multiregion.yml or the testcontainers backend:
#   QP_IMAGE=local/quotaplane:dev REDIS_IMAGE=local/redis:7 NATS_IMAGE=local/nats:2
# Needs: docker (daemon running), redis-server, redis-cli, nats-server, wget and node on PATH, and `npm ci` done.
# Usage: docker/build-local-images.sh [redis|nats|app ...]   (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

REDIS_TAG=${REDIS_TAG:-local/redis:7}
NATS_TAG=${NATS_TAG:-local/nats:2}
APP_TAG=${APP_TAG:-local/quotaplane:dev}

work=$(mktemp -d "${TMPDIR:-/tmp}/qp-images-XXXXXX")
trap 'rm -rf "$work"' EXIT

# Copy executables into a root filesystem with every shared library they link (ldd), at the same paths.
add_binaries() {
  local rootfs=$1
  shift
  local bin path lib
  for bin in "$@"; do
    path=$(command -v "$bin") || { echo "build-local-images: $bin is not on PATH" >&2; exit 1; }
    mkdir -p "$rootfs$(dirname "$path")"
    # -L: redis-server is a symlink on Debian; the copy must carry its own name (Redis picks its mode by it).
    cp -L "$path" "$rootfs$path"
    for lib in $(ldd "$path" | grep -o '/[^ ]*'); do
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
  done
  # Writable places the servers expect.
  mkdir -p "$rootfs/data" "$rootfs/tmp" "$rootfs/etc"
  chmod 1777 "$rootfs/tmp" "$rootfs/data"
  echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
  echo 'node:x:1000:1000:node:/app:/bin/sh' >>"$rootfs/etc/passwd"
  printf 'root:x:0:\nnode:x:1000:\n' >"$rootfs/etc/group"
}

import_rootfs() {
  local rootfs=$1 tag=$2
  shift 2
  tar -C "$rootfs" -c . | docker import "$@" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$tag" >/dev/null
  echo "built $tag ($(docker image inspect "$tag" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}'))"
}

build_redis() {
  local rootfs=$work/redis
  add_binaries "$rootfs" redis-server redis-cli
  import_rootfs "$rootfs" "$REDIS_TAG" --change 'WORKDIR /data' --change 'CMD ["redis-server"]'
}

build_nats() {
  local rootfs=$work/nats
  add_binaries "$rootfs" nats-server wget
  import_rootfs "$rootfs" "$NATS_TAG" --change 'CMD ["nats-server", "-js", "-sd", "/data"]'
}

build_app() {
  local rootfs=$work/app app=$work/app/app
  add_binaries "$rootfs" node
  mkdir -p "$app"
  # The same build as docker/Dockerfile: compiled JavaScript next to lua/ and proto/, production dependencies only.
  npx tsc -p docker/tsconfig.build.json --outDir "$app"
  cp -r lua "$app/lua"
  cp -r proto "$app/proto"
  cp -r coordinator/dashboard "$app/coordinator/dashboard"
  cp package.json "$app/"
  npm ls --omit=dev --all --parseable | while read -r dir; do
    [ "$dir" = "$root" ] && continue
    mkdir -p "$app/${dir#"$root"/}"
    cp -a "$dir/." "$app/${dir#"$root"/}/"
  done
  chown -R 1000:1000 "$app"
  import_rootfs "$rootfs" "$APP_TAG" --change 'WORKDIR /app' --change 'ENV NODE_ENV=production' \
    --change 'USER 1000:1000' --change 'CMD ["node", "coordinator/main.js"]'
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(redis nats app)
for target in "${targets[@]}"; do
  case $target in
    redis) build_redis ;;
    nats) build_nats ;;
    app) build_app ;;
    *) echo "build-local-images: unknown image $target (redis, nats, app)" >&2; exit 2 ;;
  esac
done
