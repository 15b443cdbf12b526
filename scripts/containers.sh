#!/usr/bin/env bash
# Docker for tests/containers, with no registry: scripts/test calls it around pytest.
#
#   scripts/containers.sh up OWNER_PID    install docker.io and debootstrap when missing, start
#                                         dockerd when none answers, build the images, and
#                                         register OWNER_PID as a user of that dockerd
#   scripts/containers.sh down OWNER_PID  unregister; the last user stops the dockerd this
#                                         script started, by its pid (never one it did not start)
#   scripts/containers.sh build           build the images only (dockerd must be running)
#
# Every image is built offline from Debian's packages: debootstrap makes the base (from the
# mirror apt uses), `docker import` turns it into an image, and the Dockerfiles under
# celery_fencing/testing/containers/images/ add Python, Redis, ZooKeeper and RabbitMQ from
# apt, and the fenced worker from wheels built here with `pip wheel`. Each image carries the
# hash of its inputs as a label; an image whose label matches is not rebuilt, so a second
# run on one machine builds nothing (or only the worker, when celery_fencing/ changed).
# Several scripts/test runs may share one dockerd: users are pid files under $STATE/users.
# When Docker cannot start, this exits non-zero and says why: the tests must fail, not skip.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=${CELERY_FENCING_DOCKER_STATE:-/run/celery-fencing-docker}
IMAGES=celery_fencing/testing/containers/images
LABEL=org.celery-fencing.inputs
SUITE=bookworm

log() { printf '[scripts/containers] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
# The CLI packaged with the daemon (docker.io): a newer stray client may insist on buildx.
docker_cli() { if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else docker "$@"; fi; }
docker_up() { docker_cli info >/dev/null 2>&1; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "need ${missing[*]} and there is no apt-get: install them by hand"
    [ "$(id -u)" = 0 ] || die "need ${missing[*]}: run as root (apt-get install)"
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

start_dockerd() {
    docker_up && return 0
    [ "$(id -u)" = 0 ] || die "dockerd is not running and only root can start it"
    log "starting dockerd"
    # 8>&- 9>&-: the daemon must not inherit (and so hold forever) the flock descriptors.
    nohup dockerd --host unix:///var/run/docker.sock >"$STATE/dockerd.log" 2>&1 8>&- 9>&- &
    echo $! >"$STATE/dockerd.pid"
    for _ in $(seq 1 120); do
        docker_up && { log "dockerd ready (pid $(cat "$STATE/dockerd.pid"))"; return 0; }
        kill -0 "$(cat "$STATE/dockerd.pid")" 2>/dev/null || break
        sleep 0.5
    done
    tail -n 20 "$STATE/dockerd.log" >&2 || true
    rm -f "$STATE/dockerd.pid"
    die "dockerd did not start (log above, $STATE/dockerd.log): the container tests cannot run"
}

stop_dockerd() {
    local pid
    pid=$(cat "$STATE/dockerd.pid" 2>/dev/null) || return 0
    rm -f "$STATE/dockerd.pid"
    kill -0 "$pid" 2>/dev/null || return 0
    log "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    log "dockerd (pid $pid) still running after 30 s"
}

prune_users() {
    local f
    for f in "$STATE"/users/*; do
        [ -e "$f" ] || continue
        kill -0 "$(basename "$f")" 2>/dev/null || rm -f "$f"
    done
}

# --- images ----------------------------------------------------------------------------

inputs_of() { docker_cli image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true; }
hash_text() { sha256sum | cut -c1-16; }
image_id() { docker_cli image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

apt_mirror() {
    # The mirror apt already uses (deb822 sources or a one-line list), else Debian's.
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)
    [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -n1)
    echo "${uri:-http://deb.debian.org/debian}"
}

build_base() {
    local tag=celery-fencing/debian:$SUITE mirror inputs rootfs
    mirror=$(apt_mirror)
    inputs=$(printf 'debootstrap minbase %s %s' "$SUITE" "$mirror" | hash_text)
    [ "$(inputs_of "$tag")" = "$inputs" ] && return 0
    log "building $tag (debootstrap --variant=minbase $SUITE from $mirror)"
    rootfs=$(mktemp -d /var/tmp/celery-fencing-rootfs.XXXXXX)
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$STATE/debootstrap.log" 2>&1 \
        || { tail -n 20 "$STATE/debootstrap.log" >&2; rm -rf "$rootfs"; die "debootstrap failed"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker_cli import --change "LABEL $LABEL=$inputs" - "$tag" >/dev/null
    rm -rf "$rootfs"
}

# build_image NAME TAG BASE_TAG [CONTEXT_DIR [EXTRA_INPUT]]: docker build of images/NAME.
build_image() {
    local name=$1 tag=$2 base=$3 context=${4:-$IMAGES/$1} extra=${5:-} inputs old
    inputs=$( { cat "$IMAGES/$name/Dockerfile"; inputs_of "$base"; echo "$extra"; } | hash_text)
    [ "$(inputs_of "$tag")" = "$inputs" ] && return 1
    log "building $tag"
    old=$(image_id "$tag")
    # --force-rm: a failed build leaves no stopped container (and so no image held by one) behind.
    DOCKER_BUILDKIT=0 docker_cli build -q --force-rm --label "$LABEL=$inputs" --build-arg "BASE=$base" \
        -f "$IMAGES/$name/Dockerfile" -t "$tag" "$context" >"$STATE/build.log" 2>&1 \
        || { tail -n 20 "$STATE/build.log" >&2; die "docker build of $tag failed"; }
    # The image this build replaced is untagged now: remove it, unless a container still uses it
    # (the worker image is rebuilt whenever celery_fencing/ changes, so they would pile up).
    if [ -n "$old" ] && [ "$old" != "$(image_id "$tag")" ]; then docker_cli image rm "$old" >/dev/null 2>&1 || true; fi
}

build_worker() {
    # Dependencies from pyproject.toml, then celery-fencing itself from this checkout.
    local py=.venv/bin/python deps_inputs src_inputs ctx
    deps_inputs=$( { cat pyproject.toml; "$py" -V; } | hash_text)
    src_inputs=$(find celery_fencing -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z \
        | xargs -0 sha256sum | hash_text)
    ctx=$(mktemp -d /var/tmp/celery-fencing-wheels.XXXXXX)
    mkdir -p "$ctx/deps/wheels" "$ctx/worker/wheels"
    if [ "$(inputs_of celery-fencing/worker-deps:latest)" != "$( { cat "$IMAGES/worker-deps/Dockerfile"; \
            inputs_of celery-fencing/python:3; echo "$deps_inputs"; } | hash_text)" ]; then
        log "pip wheel: celery-fencing's dependencies"
        # async-timeout: redis-py needs it below Python 3.11.3, and bookworm's python3 is 3.11.2,
        # while the host's may be newer (pip wheel resolves the markers for the host).
        "$py" -m pip wheel -q -w "$ctx/deps/wheels" '.[zookeeper,redis]' 'async-timeout>=4.0.3' 2>"$STATE/pip.log" \
            || { tail -n 20 "$STATE/pip.log" >&2; die "pip wheel of the dependencies failed"; }
        rm -f "$ctx"/deps/wheels/celery_fencing-*.whl
        build_image worker-deps celery-fencing/worker-deps:latest celery-fencing/python:3 "$ctx/deps" "$deps_inputs" || true
    fi
    if [ "$(inputs_of celery-fencing/worker:latest)" != "$( { cat "$IMAGES/worker/Dockerfile"; \
            inputs_of celery-fencing/worker-deps:latest; echo "$src_inputs"; } | hash_text)" ]; then
        "$py" -m pip wheel -q --no-deps -w "$ctx/worker/wheels" . 2>"$STATE/pip.log" \
            || { tail -n 20 "$STATE/pip.log" >&2; die "pip wheel of celery-fencing failed"; }
        build_image worker celery-fencing/worker:latest celery-fencing/worker-deps:latest "$ctx/worker" "$src_inputs" || true
    fi
    rm -rf "$ctx"
}

build_all() {
    local started=$SECONDS
    build_base
    build_image python celery-fencing/python:3 "celery-fencing/debian:$SUITE" || true
    build_image redis celery-fencing/redis:7 "celery-fencing/debian:$SUITE" || true
    build_image zookeeper celery-fencing/zookeeper:3.8 "celery-fencing/debian:$SUITE" || true
    build_image rabbitmq celery-fencing/rabbitmq:3 "celery-fencing/debian:$SUITE" || true
    build_worker
    # The names pytest-celery's own Redis and RabbitMQ vendors start.
    docker_cli tag celery-fencing/redis:7 redis:latest
    docker_cli tag celery-fencing/rabbitmq:3 rabbitmq:latest
    log "images ready in $((SECONDS - started)) s"
}

# --- commands ---------------------------------------------------------------------------

mkdir -p "$STATE/users"
case "${1:-}" in
    up)
        owner=${2:?usage: scripts/containers.sh up OWNER_PID}
        install_packages
        (
            flock 9
            prune_users
            start_dockerd
            touch "$STATE/users/$owner"
        ) 9>"$STATE/lock"
        (flock 8; build_all) 8>"$STATE/build.lock"
        ;;
    down)
        owner=${2:?usage: scripts/containers.sh down OWNER_PID}
        (
            flock 9
            rm -f "$STATE/users/$owner"
            prune_users
            if [ -z "$(ls -A "$STATE/users")" ]; then stop_dockerd; fi
        ) 9>"$STATE/lock"
        ;;
    build)
        docker_up || die "dockerd is not running (scripts/containers.sh up starts it)"
        (flock 8; build_all) 8>"$STATE/build.lock"
        ;;
    *) die "usage: scripts/containers.sh up OWNER_PID | down OWNER_PID | build" ;;
esac
