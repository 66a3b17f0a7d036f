#!/usr/bin/env bash
# Build the sandbox image locally, without pulling anything from a registry.
#
#   1. base:    mmdebstrap --variant=minbase bookworm (git, ripgrep, bash,
#               ca-certificates, curl) -> tarball -> `docker import` as $BASE_IMAGE
#   2. sandbox: docker build --build-arg BASE=$BASE_IMAGE -t $SANDBOX_IMAGE sandbox/
#
# The base step is skipped when its image exists unless --force is given; the sandbox
# step always runs (Docker's layer cache makes it quick when nothing changed). Each
# step is timed. mmdebstrap is installed with apt-get if missing. The Debian mirror
# is the one this machine's apt already uses (its deb822 debian.sources), so the build
# reaches nothing but Debian's package mirror.
#
# Usage: scripts/build-sandbox-image.sh [--force]
# Environment:
#   BASE_IMAGE      default threadgate-base:bookworm
#   SANDBOX_IMAGE   default threadgate-sandbox:latest
#   DEBIAN_SOURCES  apt sources file handed to mmdebstrap
#                   (default /etc/apt/sources.list.d/debian.sources when it exists)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_image="${BASE_IMAGE:-threadgate-base:bookworm}"
sandbox_image="${SANDBOX_IMAGE:-threadgate-sandbox:latest}"
packages="git,ripgrep,bash,ca-certificates,curl"
force=0

for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "build-sandbox-image: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

say() { echo "build-sandbox-image: $*" >&2; }
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

build_base() {
    if ! command -v mmdebstrap >/dev/null 2>&1; then
        say "installing mmdebstrap with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q --no-install-recommends mmdebstrap
    fi

    local mirror_args=()
    local sources="${DEBIAN_SOURCES:-/etc/apt/sources.list.d/debian.sources}"
    if [ -f "$sources" ] && grep -q bookworm "$sources"; then
        # A sources file as MIRROR is pasted into the chroot's sources.list as is.
        mirror_args=("$sources")
    fi

    local work
    work="$(mktemp -d)"
    # shellcheck disable=SC2064 # expand $work now: it is local.
    trap "rm -rf '$work'" RETURN

    mmdebstrap --variant=minbase --include="$packages" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --aptopt='Acquire::Languages "none"' \
        bookworm "$work/base.tar" "${mirror_args[@]}"
    docker import \
        --change 'CMD ["/bin/bash"]' \
        --message "threadgate base: mmdebstrap minbase bookworm + $packages" \
        "$work/base.tar" "$base_image" >/dev/null
}

build_sandbox() {
    # The classic builder is used on purpose: Debian 12's docker.io has no buildx, and
    # the build needs no BuildKit feature.
    DOCKER_BUILDKIT=0 docker build --build-arg "BASE=$base_image" \
        -t "$sandbox_image" "$repo_root/sandbox"
}

# Runs "$@" and prints how long it took.
timed() {
    local label="$1"
    shift
    local start_ns
    start_ns=$(date +%s%N)
    "$@"
    local end_ns
    end_ns=$(date +%s%N)
    say "$label took $(( (end_ns - start_ns) / 1000000 )) ms"
}

if [ "$force" -eq 0 ] && image_exists "$base_image"; then
    say "base image $base_image exists; skipping (use --force to rebuild)"
else
    timed "base image $base_image" build_base
fi

# Always rebuilt: it takes seconds (cached layers), and a stale image would run an old
# agent runner or none at all after sandbox/bin changed.
timed "sandbox image $sandbox_image" build_sandbox

say "ready: $sandbox_image ($(docker image inspect --format '{{.Size}}' "$sandbox_image") bytes)"
