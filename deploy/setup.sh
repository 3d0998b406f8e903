#!/usr/bin/env bash
# Installs what sv needs on Debian 12 (only what is missing) and builds it.
# Used by deploy/dev.sh and deploy/test.sh; safe to run again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SV_BUILD_DIR:-$ROOT/build}"

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libpqxx-dev libspdlog-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev libcpp-httplib-dev libssl-dev
  libjemalloc-dev
  postgresql-15 postgresql-contrib
  clang-14 libclang-rt-14-dev prometheus
  chromium
)
# node and npm run the browser test (tests/e2e); a machine may already have
# another build of node (e.g. nodesource's, which bundles npm).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "sv: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "sv: need root or sudo to install packages" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # The server package must not leave a system cluster running: sv starts
  # its own private clusters.
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The e2e test's npm packages, pinned by tests/e2e/package-lock.json; never
# a browser download (playwright-core drives Debian's chromium).
if [[ ! -d "$ROOT/tests/e2e/node_modules" ]]; then
  (cd "$ROOT/tests/e2e" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi

JOBS="${SV_BUILD_JOBS:-$(nproc)}"
# SV_CMAKE_ARGS: extra configure arguments (deploy/test.sh --sanitize).
if [[ ! -f "$BUILD_DIR/build.ninja" || -n "${SV_CMAKE_ARGS:-}" ]]; then
  # shellcheck disable=SC2086
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${SV_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
