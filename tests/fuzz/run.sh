#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time
# (default 20 s) on its committed corpus; the suite (label fuzz) runs 10 s
# each, about a minute for the six. New inputs that grow coverage land
# in <build>/new-corpus/<target>, never in the source tree; copy the
# worthwhile ones into tests/fuzz/corpus/. Exit code non-zero on any crash,
# leak or sanitizer report.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SECONDS_EACH="${1:-20}"
BUILD="${SV_FUZZ_BUILD_DIR:-$HERE/../../build-fuzz}"
CXX_BIN="$(command -v clang++-14 || command -v clang++ || true)"
if [[ -z "$CXX_BIN" ]]; then echo "fuzz: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; fi
cmake -S "$HERE" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER="$CXX_BIN" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" >/dev/null
for target in validation create_request json_request rest_gateway cli_args agent_message; do
  corpus="$HERE/corpus/$target"
  fresh="$BUILD/new-corpus/$target"
  mkdir -p "$fresh"
  echo "fuzz: $target for ${SECONDS_EACH}s"
  if ! "$BUILD/${target}_fuzz" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=5 \
      -artifact_prefix="$BUILD/" -print_final_stats=1 "$fresh" "$corpus" >"$BUILD/$target.log" 2>&1; then
    tail -40 "$BUILD/$target.log" >&2
    echo "fuzz: $target failed; the crashing input is in $BUILD/" >&2
    exit 1
  fi
  grep -E "^(stat::number_of_executed_units|Done)" "$BUILD/$target.log" || true
done
echo "fuzz: all targets clean"
