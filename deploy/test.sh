#!/usr/bin/env bash
# One command for the whole test suite: installs what is missing, builds,
# and runs every test (unit and integration). Integration tests start their
# own throwaway PostgreSQL clusters (as the postgres user when run as root)
# and stop them afterwards. Pass ctest arguments through, e.g. -L unit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/deploy/setup.sh"
BUILD_DIR="${SV_BUILD_DIR:-$ROOT/build}"
cd "$BUILD_DIR"
ctest --output-on-failure -j "${SV_TEST_JOBS:-2}" "$@"
