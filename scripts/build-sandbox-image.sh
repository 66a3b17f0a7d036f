#!/usr/bin/env bash
# Build the sandbox image locally, without pulling anything from a registry.
#
#   1. base:    mmdebstrap --variant=minbase bookworm (git, ripgrep, bash,
#               ca-certificates, curl) -> tarball -> `docker import` as $BASE_IMAGE
#   2. runner:  cargo build -p threadgate-agent-runner on this host (Debian bookworm,
#               the base's release, so glibc matches), stripped into sandbox/bin/
#               (replaced only when its bytes change). Only the runner's package
#               (crates/agent-runner) and its few dependencies are compiled, never the
#               server's tree.
#   3. sandbox: docker build --build-arg BASE=$BASE_IMAGE -t $SANDBOX_IMAGE sandbox/
#
# A step whose image already exists is skipped unless --force is given (--force rebuilds
# both). Each step is timed. mmdebstrap is installed with apt-get if missing. The Debian
# mirror is the one this machine's apt already uses (its deb822 debian.sources), so the
# build reaches nothing but Debian's package mirror.
#
# Usage: scripts/build-sandbox-image.sh [--force]
# Environment:
#   BASE_IMAGE      default threadgate-base:bookworm
#   SANDBOX_IMAGE   default threadgate-sandbox:latest
#   RUNNER_PROFILE  dev (default: a stripped debug build, cheap to compile) or release
#   CARGO_TARGET_DIR  where cargo builds (default: the repository's target/)
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

build_runner() {
    local profile="${RUNNER_PROFILE:-dev}" out_dir=debug
    local args=(build --quiet -p threadgate-agent-runner --bin threadgate-agent-runner)
    case "$profile" in
        dev) ;;
        release) args+=(--release); out_dir=release ;;
        *) say "RUNNER_PROFILE must be dev or release, not '$profile'"; exit 2 ;;
    esac
    if ! grep -q bookworm /etc/os-release; then
        say "the runner must be built on Debian bookworm (the base image's release) so its glibc matches; /etc/os-release says otherwise"
        exit 1
    fi
    (cd "$repo_root" && cargo "${args[@]}")
    local built="${CARGO_TARGET_DIR:-$repo_root/target}/$out_dir/threadgate-agent-runner"
    local slot="$repo_root/sandbox/bin/threadgate-agent-runner"
    strip -o "$slot.new" "$built"
    if cmp -s "$slot.new" "$slot"; then
        rm -f "$slot.new"
    else
        mv -f "$slot.new" "$slot"
        say "runner updated in sandbox/bin ($(stat -c %s "$slot") bytes)"
    fi
}

build_sandbox() {
    # The classic builder is used on purpose: Debian 12's docker.io has no buildx, and
    # the build needs no BuildKit feature.
    DOCKER_BUILDKIT=0 docker build --build-arg "BASE=$base_image" \
        --label "threadgate.context=$context_hash" \
        -t "$sandbox_image" "$repo_root/sandbox"
}

built_hash() {
    docker image inspect --format '{{ index .Config.Labels "threadgate.context" }}' "$1" 2>/dev/null
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

timed "runner" build_runner

# A hash of what goes into the sandbox image, so a changed Dockerfile or runner
# rebuilds it instead of reusing a stale image.
context_hash=$(cd "$repo_root/sandbox" && find . -type f ! -name README.md ! -name .gitignore -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)

if [ "$force" -eq 0 ] && [ "$(built_hash "$sandbox_image")" = "$context_hash" ]; then
    say "sandbox image $sandbox_image is up to date; skipping (use --force to rebuild)"
else
    timed "sandbox image $sandbox_image" build_sandbox
fi

say "ready: $sandbox_image ($(docker image inspect --format '{{.Size}}' "$sandbox_image") bytes)"
