#!/usr/bin/env bash
# One command for the whole test suite: installs what is missing, builds,
# and runs every test (unit and integration). Integration tests start their
# own throwaway PostgreSQL clusters (as the postgres user when run as root)
# and stop them afterwards. Pass ctest arguments through, e.g. -L unit.
#
# deploy/test.sh --sanitize [ctest args]: the same suite built with
# AddressSanitizer and UndefinedBehaviorSanitizer into build-asan (or
# $SV_BUILD_DIR), without benchmarks and without the fuzz label (the fuzz
# targets carry their own sanitizers). Reports of child processes (svd,
# svagent, svctl) land in <build>/sanitizer-logs/ and fail the run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SANITIZE=0
if [[ "${1:-}" == "--sanitize" ]]; then
  SANITIZE=1
  shift
  export SV_BUILD_DIR="${SV_BUILD_DIR:-$ROOT/build-asan}"
  export SV_CMAKE_ARGS="-DSV_SANITIZE=address,undefined -DSV_BUILD_BENCH=OFF"
fi
"$ROOT/deploy/setup.sh"
BUILD_DIR="${SV_BUILD_DIR:-$ROOT/build}"
cd "$BUILD_DIR"
if ((SANITIZE == 0)); then
  exec ctest --output-on-failure -j "${SV_TEST_JOBS:-2}" "$@"
fi
LOGS="$BUILD_DIR/sanitizer-logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
chmod 1777 "$LOGS"  # svd's PostgreSQL helpers may run as another user.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0:log_path=$LOGS/asan:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$LOGS/ubsan:${UBSAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$ROOT/deploy/lsan.supp:${LSAN_OPTIONS:-}"
start=$(date +%s)
rc=0
ctest --output-on-failure -j "${SV_TEST_JOBS:-2}" -LE fuzz "$@" || rc=$?
echo "sanitize: ctest finished in $(( $(date +%s) - start )) s (exit $rc)"
# A log holding only the "Suppressions used" summary (deploy/lsan.supp) is
# not a report; any ERROR or UBSan runtime error is.
reports="$(grep -lE "ERROR: |runtime error:" "$LOGS"/* 2>/dev/null || true)"
if [[ -n "$reports" ]]; then
  echo "sanitize: sanitizer reports in $LOGS:" >&2
  for f in $reports; do echo "== $f" >&2; head -60 "$f" >&2; done
  rc=1
fi
exit $rc
