#!/usr/bin/env bash
# Build docker/Dockerfile into a real OCI image with podman (no Docker engine needed) and run it
# against this machine's MariaDB and Redis: migrations, the web process (/health/ready 200, static
# files, the login page), a node joining the cluster and running jobs, the node's drain on SIGTERM.
#
#   docker/image-test.sh          (make image-test; a step of .ci/run)
#
# The base is Debian bookworm made here by debootstrap and imported as localhost/bookworm-base
# (no image registry is reachable); the Dockerfile takes it as BASE in place of
# debian:bookworm-slim. Idempotent: the base (and podman's layer cache) is reused when present;
# the containers it starts, its database and its Redis keys are removed at exit, pass or fail.
# Scratch (rootfs, podman storage) lives in IMAGE_TEST_SCRATCH, never in the repository.
#
# Environment: IMAGE_TEST_SCRATCH (default /work/scratch-image), IMAGE_TEST_DB (sched_image),
# IMAGE_TEST_MYSQL (host:port of MariaDB, root without password; 127.0.0.1:3306),
# IMAGE_TEST_REDIS (redis://127.0.0.1:6379/13), IMAGE_TEST_STORAGE_DRIVER (overlay; or vfs).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

if [ -d /work ] && [ -w /work ]; then DEFAULT_SCRATCH=/work/scratch-image; else
  DEFAULT_SCRATCH=${TMPDIR:-/var/tmp}/scheduler-image-test; fi
SCRATCH=${IMAGE_TEST_SCRATCH:-$DEFAULT_SCRATCH}
case "$SCRATCH/" in "$ROOT"/*) echo "IMAGE_TEST_SCRATCH must be outside the repository" >&2; exit 2;; esac
DB=${IMAGE_TEST_DB:-sched_image}
MYSQL_ADDR=${IMAGE_TEST_MYSQL:-127.0.0.1:3306}
MYSQL_HOST=${MYSQL_ADDR%:*} MYSQL_PORT=${MYSQL_ADDR##*:}
REDIS=${IMAGE_TEST_REDIS:-redis://127.0.0.1:6379/13}
REDIS_DB=${REDIS##*/}
DRIVER=${IMAGE_TEST_STORAGE_DRIVER:-overlay}
BASE_IMAGE=localhost/bookworm-base
IMAGE=localhost/scheduler:image-test
RUN_ID=$$
PREFIX="imgtest$RUN_ID"
WEB=sched-image-web-$RUN_ID
NODE=sched-image-node-$RUN_ID
INIT=sched-image-init-$RUN_ID
PACKAGES=(podman buildah debootstrap uidmap slirp4netns fuse-overlayfs runc)

now_ms() { echo $(($(date +%s%N) / 1000000)); }
since() { local ms=$(($(now_ms) - $1)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
log() { printf '\n--- image-test: %s\n' "$*"; }
# Each check that holds is counted; the last line is "N passed, M failed" (what CI reads).
PASSED=0 FAILED=0
ok() { PASSED=$((PASSED + 1)); echo "image-test: ok: $*"; }
fail() { FAILED=1; printf 'image-test: FAIL: %s\n' "$*" >&2; exit 1; }

# --- tools and configuration -------------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
for tool in curl mysql redis-cli; do
  command -v "$tool" >/dev/null || fail "$tool is needed on the host"
done

mkdir -p "$SCRATCH"/{conf,storage,run,tmp}
# Storage and engine settings of our own (podman's defaults ask for systemd, crun and 1M files).
cat >"$SCRATCH/conf/storage.conf" <<EOF
[storage]
driver = "$DRIVER"
graphroot = "$SCRATCH/storage"
runroot = "$SCRATCH/run"
EOF
cat >"$SCRATCH/conf/containers.conf" <<EOF
[containers]
netns = "host"
cgroupns = "host"
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
tmp_dir = "$SCRATCH/tmp"
image_copy_tmp_dir = "$SCRATCH/tmp"
EOF
export CONTAINERS_STORAGE_CONF="$SCRATCH/conf/storage.conf" CONTAINERS_CONF="$SCRATCH/conf/containers.conf"
export BUILDAH_ISOLATION=chroot TMPDIR="$SCRATCH/tmp"

mysql_root() { mysql -h"$MYSQL_HOST" -P"$MYSQL_PORT" -uroot "$@"; }
redis_host_cli() {
  local hostport=${REDIS#redis://}; hostport=${hostport%%/*}
  redis-cli -h "${hostport%:*}" -p "${hostport##*:}" -n "$REDIS_DB" "$@"
}
mysql_root -e 'SELECT 1' >/dev/null 2>&1 || fail "MariaDB is not reachable at $MYSQL_ADDR"
redis_host_cli ping >/dev/null 2>&1 || fail "Redis is not reachable at $REDIS"

cleanup() {
  local rc=$?
  set +e
  for c in "$NODE" "$WEB" "$INIT"; do
    podman container exists "$c" 2>/dev/null && podman rm -f -t 5 "$c" >/dev/null 2>&1
  done
  mysql_root -e "DROP DATABASE IF EXISTS \`$DB\`" 2>/dev/null
  redis_host_cli --scan --pattern "$PREFIX*" 2>/dev/null | while read -r key; do
    redis_host_cli del "$key" >/dev/null
  done
  rm -f "$SCRATCH/env.$RUN_ID" "$SCRATCH/jobs.$RUN_ID.yaml"
  [ $rc = 0 ] || FAILED=1
  echo "image-test: cleaned up the containers it started, database $DB and its Redis keys"
  echo "image-test: $PASSED passed, $FAILED failed"
  exit $rc
}
trap cleanup EXIT

# --- the base: Debian bookworm by debootstrap, as debian:bookworm-slim would give it ------------
# debian:bookworm-slim is a minbase debootstrap with the official images' slimming (debuerreotype):
# no docs, man pages or translations, apt's caches cleaned after each run. The same here, so the
# layers measure what they would on the published base. BASE_RECIPE names this recipe: a base made
# by another one is made again.
BASE_RECIPE=2
base_recipe() {
  podman image inspect --format '{{index .Config.Labels "org.scheduler.base-recipe"}}' "$BASE_IMAGE" 2>/dev/null
}
if podman image exists "$BASE_IMAGE" && [ "$(base_recipe)" = "$BASE_RECIPE" ]; then
  log "base $BASE_IMAGE present (recipe $BASE_RECIPE), reused"
else
  ROOTFS="$SCRATCH/rootfs"
  if [ "$(cat "$ROOTFS/.complete" 2>/dev/null)" != "$BASE_RECIPE" ]; then
    log "debootstrap bookworm (minbase) into $ROOTFS"
    rm -rf "$ROOTFS"
    started=$(now_ms)
    debootstrap --variant=minbase bookworm "$ROOTFS" http://deb.debian.org/debian \
      >"$SCRATCH/debootstrap.log" 2>&1 || { tail -20 "$SCRATCH/debootstrap.log"; fail "debootstrap"; }
    # The sources debian:bookworm-slim has (with its updates and security suites).
    rm -f "$ROOTFS/etc/apt/sources.list"
    cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # The official images' apt and dpkg configuration, and the slim variant's excludes.
    cat >"$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' >"$ROOTFS/etc/apt/apt.conf.d/docker-no-languages"
    printf 'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\n' \
      >"$ROOTFS/etc/apt/apt.conf.d/docker-gzip-indexes"
    echo 'Apt::AutoRemove::SuggestsImportant "false";' \
      >"$ROOTFS/etc/apt/apt.conf.d/docker-autoremove-suggests"
    echo 'force-unsafe-io' >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
    cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
    find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$ROOTFS"/usr/share/{groff,info,linda,locale,man}/* "$ROOTFS"/usr/share/lintian/overrides/*
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/cache/apt/*.bin \
      "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/apt/* "$ROOTFS"/var/log/dpkg.log \
      "$ROOTFS"/var/log/bootstrap.log
    echo "$BASE_RECIPE" >"$ROOTFS/.complete"
    echo "image-test: debootstrap took $(since "$started") s"
  fi
  log "importing $BASE_IMAGE"
  if podman image exists "$BASE_IMAGE"; then podman rmi -f "$BASE_IMAGE" >/dev/null; fi
  tar -C "$ROOTFS" --exclude=./.complete -c . \
    | podman import --change 'CMD ["/bin/bash"]' \
      --change "LABEL org.scheduler.base-recipe=$BASE_RECIPE" - "$BASE_IMAGE" >/dev/null
fi
echo "image-test: base $BASE_IMAGE: $(($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE") / 1000000)) MB"

# --- build ------------------------------------------------------------------------------------
BUILD_ARGS=(--build-arg "BASE=$BASE_IMAGE")
# pip inside the build verifies PyPI with this machine's CA bundle: a build secret, mounted for
# the pip step only (not over the image's own bundle, and in no layer).
HOST_CA=/etc/ssl/certs/ca-certificates.crt
if [ -r "$HOST_CA" ]; then BUILD_ARGS+=(--secret "id=pip-cert,src=$HOST_CA"); fi
log "building $IMAGE"
started=$(now_ms)
# The builder stage is tagged too: pruning what no tag holds (older builds) keeps its cache.
for target in builder final; do
  if [ $target = builder ]; then tag=(--target builder -t "$IMAGE-builder"); else tag=(-t "$IMAGE"); fi
  podman build --isolation chroot --network host --format docker --layers "${BUILD_ARGS[@]}" \
    "${tag[@]}" -f docker/Dockerfile . >"$SCRATCH/build-$target.log" 2>&1 \
    || { tail -30 "$SCRATCH/build-$target.log"; fail "podman build (log: $SCRATCH/build-$target.log)"; }
done
build_s=$(since "$started")
podman image prune -f >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
# Steps of both stages (FROM aside), and how many came from the cache: the builder's as its own
# build found them (the final build always finds those just made).
hits() { grep -c -- '^--> Using cache' "$SCRATCH/build-$1.log" || true; }
builder_steps=$(grep -E '^STEP [0-9]+/[0-9]+: ' "$SCRATCH/build-builder.log" | grep -vc ': FROM ' || true)
steps=$(grep -E '^\[[0-9]+/[0-9]+\] STEP [0-9]+/[0-9]+: ' "$SCRATCH/build-final.log" | grep -vc ': FROM ' || true)
cached=$(($(hits builder) + $(hits final) - builder_steps))
ok "built $IMAGE in $build_s s ($cached of $steps steps from cache), $((size / 1000000)) MB"

# What must not be in it: the build's CA bundle or its variable, a compiler, pip; nor root.
grep -q PIP_CERT <<<"$(podman image inspect --format '{{json .Config.Env}}' "$IMAGE")" \
  && fail "PIP_CERT is in the image's environment"
inside=$(podman run --rm --no-healthcheck --network host "$IMAGE" \
  sh -c 'id -u; ls -d /run/secrets/* /run/host-ca.crt 2>/dev/null; command -v gcc cc pip pip3 || true')
[ "$inside" = 10001 ] || fail "the image runs as $(head -1 <<<"$inside") or holds: $(tail -n +2 <<<"$inside")"
ok "runs as uid 10001; no compiler, pip or build CA bundle inside"

# --- run: the same image for every role --------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
WEB_PORT=$(free_port)
NODE_PORT=$(free_port)
mysql_root -e "DROP DATABASE IF EXISTS \`$DB\`; CREATE DATABASE \`$DB\` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
# Settings through a file (the secret key is not on any command line).
umask 077
cat >"$SCRATCH/env.$RUN_ID" <<EOF
DATABASE_URL=mysql://root@$MYSQL_HOST:$MYSQL_PORT/$DB
REDIS_URL=$REDIS
SCHEDULER_REDIS_PREFIX=$PREFIX
DJANGO_SECRET_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')
DJANGO_ALLOWED_HOSTS=127.0.0.1,localhost
DJANGO_SECURE_SSL_REDIRECT=0
LOG_FORMAT=json
EOF
umask 022
# As in Kubernetes (docker/k8s): a read-only root file system, writable /tmp and /app/var only.
# Health checks are run by hand below (podman's timers need systemd).
RUN_OPTS=(--no-healthcheck --network host --env-file "$SCRATCH/env.$RUN_ID" --read-only --tmpfs /tmp --tmpfs /app/var:rw,mode=1777)
in_image() { podman run --rm "${RUN_OPTS[@]}" "$@"; }

log "migrate"
in_image "$IMAGE" python manage.py migrate --noinput >"$SCRATCH/migrate.log" 2>&1 \
  || { cat "$SCRATCH/migrate.log"; fail "migrate"; }
in_image "$IMAGE" python manage.py migrate --check >/dev/null 2>&1 || fail "migrate --check after migrate"
tables=$(mysql_root -N -e "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema='$DB'")
ok "migrate: $tables tables in $DB; migrate --check passes"
# The Kubernetes pods' init container (docker/k8s), as written there, returns once migrated.
podman run --rm -i --no-healthcheck "$IMAGE" python -c '
import sys, yaml
[pod] = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all(sys.stdin)
         if d["kind"] == "Deployment" and d["metadata"]["name"] == "scheduler-node"]
print("\0".join(pod["initContainers"][0]["command"]), end="")' <docker/k8s/scheduler.yaml \
  | xargs -0 -r timeout 60 podman run --rm --name "$INIT" "${RUN_OPTS[@]}" "$IMAGE" >/dev/null \
  || fail "the Kubernetes init container's command did not return within 60 s"
ok "the Kubernetes init container (wait for migrations) returns on the migrated database"

log "web (daphne) on 127.0.0.1:$WEB_PORT"
podman run -d --name "$WEB" "${RUN_OPTS[@]}" "$IMAGE" \
  daphne -b 127.0.0.1 -p "$WEB_PORT" scheduler_project.asgi:application >/dev/null
wait_http() {  # URL SECONDS -> 0 once it answers 200
  local deadline=$(($(date +%s) + $2))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1")" = 200 ] && return 0
    sleep 0.5
  done
  return 1
}
started=$(now_ms)
wait_http "http://127.0.0.1:$WEB_PORT/health/ready" 60 \
  || { podman logs "$WEB" 2>&1 | tail -20; fail "web /health/ready did not answer 200 in 60 s"; }
ready_s=$(since "$started")
ok "web /health/ready 200 in $ready_s s: $(curl -s "http://127.0.0.1:$WEB_PORT/health/ready")"
expect() {  # PATH CODE [TEXT]
  local body code
  body=$(curl -s -w '\n%{http_code}' --max-time 5 "http://127.0.0.1:$WEB_PORT$1")
  code=${body##*$'\n'}
  [ "$code" = "$2" ] || fail "GET $1: HTTP $code, expected $2"
  [ -z "${3:-}" ] || grep -q -- "$3" <<<"$body" || fail "GET $1: no '$3' in the answer"
  ok "GET $1 -> $code${3:+ (has '$3')}"
}
expect /health/live 200 '"ok"'
# The image's own HEALTHCHECK command, run in the container (its port 8000 is this run's port).
health=$(podman image inspect --format '{{json .HealthCheck.Test}}' "$IMAGE")
grep -q 'health/live' <<<"$health" || fail "the image has no HEALTHCHECK on /health/live: $health"
python3 -c 'import json, sys; t = json.loads(sys.argv[1]); assert t[0] == "CMD"; print("\0".join(t[1:]), end="")' \
  "${health//8000/$WEB_PORT}" | xargs -0 -r podman exec "$WEB" \
  || fail "the image's HEALTHCHECK command fails in the web container"
ok "the image's HEALTHCHECK command passes in the web container"
expect /static/dashboard/css/dashboard.css 200   # the dashboard's files, collected at build time
expect /static/admin/css/base.css 200
expect /login/ 200 'csrfmiddlewaretoken'
expect / 302

log "node (runnode) with metrics on 127.0.0.1:$NODE_PORT"
podman run -d --name "$NODE" "${RUN_OPTS[@]}" "$IMAGE" \
  python manage.py runnode --node-id "image-test-$RUN_ID" --metrics-host 127.0.0.1 --metrics-port "$NODE_PORT" >/dev/null
wait_http "http://127.0.0.1:$NODE_PORT/health/ready" 60 \
  || { podman logs "$NODE" 2>&1 | tail -20; fail "node /health/ready did not answer 200 in 60 s"; }
ok "node /health/ready 200 (a cluster member)"
nodes=$(in_image "$IMAGE" python manage.py nodes list 2>&1) || fail "manage.py nodes list: $nodes"
grep -q "image-test-$RUN_ID" <<<"$nodes" || fail "manage.py nodes list lacks the node: $nodes"
ok "manage.py nodes list shows image-test-$RUN_ID"

log "jobs: a thread-isolated and a process-isolated run"
cat >"$SCRATCH/jobs.$RUN_ID.yaml" <<EOF
jobs:
  - {name: image-test-log, task: log, kwargs: {message: "hello from image-test $RUN_ID"},
     schedule_type: interval, interval_seconds: 86400}
  - {name: image-test-noop, task: noop, isolation: process, schedule_type: interval,
     interval_seconds: 86400}
EOF
podman run --rm -i "${RUN_OPTS[@]}" "$IMAGE" python manage.py jobs apply - <"$SCRATCH/jobs.$RUN_ID.yaml"
ids=()
for job in image-test-log image-test-noop; do
  out=$(in_image "$IMAGE" python manage.py jobs trigger "$job")
  echo "image-test: $out"
  ids+=("${out##* }")
done
q() { mysql_root -N -D "$DB" -e "$1"; }
for id in "${ids[@]}"; do
  deadline=$(($(date +%s) + 60))
  while :; do
    status=$(q "SELECT status FROM jobs_jobexecution WHERE id=$id")
    case "$status" in succeeded|failed|timed_out|cancelled|lost|skipped) break;; esac
    [ "$(date +%s)" -lt "$deadline" ] || break
    sleep 0.5
  done
  row=$(q "SELECT j.name, e.status, e.node, ROUND(e.duration_ms, 1), e.output FROM jobs_jobexecution e JOIN jobs_job j ON j.id=e.job_id WHERE e.id=$id")
  echo "image-test: execution $id: $row"
  [ "$status" = succeeded ] || { podman logs "$NODE" 2>&1 | tail -20; fail "execution $id ended $status"; }
  grep -q "image-test-$RUN_ID" <<<"$row" || fail "execution $id did not run on the image's node"
  ok "execution $id succeeded on image-test-$RUN_ID"
done
output=$(q "SELECT output FROM jobs_jobexecution WHERE id=${ids[0]}")
grep -q "hello from image-test $RUN_ID" <<<"$output" \
  || fail "the log task's output is not in its run"
ok "the log task's message is in its run's output"

for c in "$WEB" "$NODE"; do
  echo "image-test: $c memory: $(podman stats --no-stream --format '{{.MemUsage}}' "$c" 2>/dev/null || echo n/a)"
done

log "drain: SIGTERM to the node"
started=$(now_ms)
podman stop -t 40 "$NODE" >/dev/null
stop_s=$(since "$started")
code=$(podman inspect --format '{{.State.ExitCode}}' "$NODE")
[ "$code" = 0 ] || { podman logs "$NODE" 2>&1 | tail -20; fail "the node exited $code on SIGTERM"; }
ok "SIGTERM: the node drained and exited 0 in $stop_s s"
state=$(q "SELECT status FROM cluster_schedulernode WHERE node_id='image-test-$RUN_ID'")
[ "$state" = stopped ] || fail "the drained node is $state, not stopped"
ok "the node's row says stopped"

echo "image-test: PASS ($IMAGE, $((size / 1000000)) MB, build $build_s s)"
