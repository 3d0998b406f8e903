#!/usr/bin/env bash
# One command for the embedded default: installs what is missing, builds,
# and runs `svd --dev` (private PostgreSQL under ./.sv, a simulated fleet of
# 16 nodes x 8 RTX 4090, and svctl configured). Extra arguments go to svd.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/deploy/setup.sh"
BUILD_DIR="${SV_BUILD_DIR:-$ROOT/build}"

# Put svctl on PATH for the quickstart.
if [[ $(id -u) -eq 0 ]]; then BIN_DIR=/usr/local/bin; else BIN_DIR="$HOME/.local/bin"; fi
mkdir -p "$BIN_DIR"
ln -sf "$BUILD_DIR/src/cli/svctl" "$BIN_DIR/svctl"
echo "sv: svctl is at $BIN_DIR/svctl; try 'svctl create --gpus 8' in another terminal"

cd "$ROOT"
exec "$BUILD_DIR/src/server/svd" --dev --http-listen 127.0.0.1:7080 "$@"
