#!/usr/bin/env bash
# Runs bench_e2e_create for two settings, A and B, in balanced order: sets of
# A B B A, then B A A B, and so on, so that neither setting always runs
# first. On the shared development machines the second run of a pair tends
# to do better (docs/reliability.md, "Start confirmations of many nodes in
# one transaction"); alternating A B A B credits that to B.
#
#   bench/e2e/pairs.sh [--sets N] [--bench PATH] --a 'VAR=value;...' --b 'VAR=value;...'
#
# --a and --b are environment assignments for that side's runs, separated
# by `;` (so a value may hold spaces), e.g.
#   --a 'SV_BENCH_SVD_ARGS=--agent-confirm-batch-lanes 0' --b ''
#   --a 'SV_BENCH_SVD=/tmp/old/svd;SV_BENCH_NODES=256' --b 'SV_BENCH_NODES=256'
# Anything set in the caller's environment (SV_BENCH_DELETE=0,
# SV_BENCH_NODES, SV_BENCH_PROFILE, ...) applies to both sides. Prints one
# line per run and, at the end, the range of each figure per side.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH="${ROOT}/build/bench/e2e/bench_e2e_create"
SETS=1
A_ENV=""
B_ENV=""
A_SET=0
B_SET=0
while (($#)); do
  case "$1" in
    --sets) SETS="$2"; shift 2 ;;
    --bench) BENCH="$2"; shift 2 ;;
    --a) A_ENV="$2"; A_SET=1; shift 2 ;;
    --b) B_ENV="$2"; B_SET=1; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "pairs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ((A_SET == 0 || B_SET == 0)); then
  echo "pairs.sh: give both --a and --b (either may be '')" >&2
  exit 2
fi
if ! [[ "$SETS" =~ ^[1-9][0-9]*$ ]]; then
  echo "pairs.sh: --sets must be a positive number, got '$SETS'" >&2
  exit 2
fi
if [[ ! -x "$BENCH" ]]; then
  echo "pairs.sh: no benchmark at $BENCH (build it: ninja -C build bench_e2e_create)" >&2
  exit 1
fi

RESULTS="$(mktemp)"
trap 'rm -f "$RESULTS"' EXIT

# One run of side $1 (A or B); appends "side creates/s p50 p99 ratio cpu others".
run() {
  local side="$1" out
  local -a assignments=()
  if [[ -n "$2" ]]; then IFS=';' read -ra assignments <<<"$2"; fi
  out="$(env "${assignments[@]}" "$BENCH" 2>/dev/null | grep -v '^\[')" || {
    echo "pairs.sh: run of $side failed" >&2
    return 1
  }
  awk -v side="$side" -v at="$(date -u +%H:%M:%S)" '
    # With SV_BENCH_PROFILE=1: the creates over 100 ms, from the table by
    # the second.
    /creates by the second/ { t = 1; slow = 0; next }
    t && NF == 6 && $1 ~ /^[0-9]+$/ { slow += $6; next }
    t { t = 0 }
    /creates\/s/ && !c { c = $2 }
    /p50 latency/ { p50 = $3 }
    /p99 latency/ { p99 = $3 }
    /ratio creates\/s/ { for (i = 1; i <= NF; i++) if ($i == "=") r = $(i + 1) }
    /^CPU ms per create/ {
      for (i = 1; i <= NF; i++) {
        if ($i == "=") cpu = $(i + 1)
        if ($i == "cores") { o = $(i - 1); sub(/^\(/, "", o) }
      }
      sub(/;$/, "", cpu)
    }
    END {
      printf "%s %s creates/s %s p50_ms %s p99_ms %s ratio %s cpu_ms %s others %s", side, at,
             c, p50, p99, r, cpu, o
      if (slow != "") printf " over_100ms %s", slow
      printf "\n"
    }' <<<"$out" | tee -a "$RESULTS"
}

for ((s = 0; s < SETS; s++)); do
  if ((s % 2 == 0)); then order="A B B A"; else order="B A A B"; fi
  for side in $order; do
    if [[ "$side" == A ]]; then run A "$A_ENV"; else run B "$B_ENV"; fi
  done
done

echo "ranges over $((2 * SETS)) runs each:"
for side in A B; do
  awk -v side="$side" '
    $1 == side {
      n++
      for (i = 3; i < NF; i += 2) {
        k = $i; v = $(i + 1) + 0
        if (!(k in lo) || v < lo[k]) lo[k] = v
        if (!(k in hi) || v > hi[k]) hi[k] = v
        if (n == 1) keys[++nk] = k
      }
    }
    END {
      line = side ":"
      for (j = 1; j <= nk; j++) line = line sprintf(" %s %s-%s", keys[j], lo[keys[j]], hi[keys[j]])
      print line
    }' "$RESULTS"
done
