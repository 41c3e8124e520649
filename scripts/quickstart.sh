#!/usr/bin/env bash
# forkd's main job on a fresh machine: install what is needed, build the guest image (first run
# only, cached), boot and warm a Python parent VM, freeze it, fork children copy-on-write from
# it, run a command and a Python cell in every child, and print timings.
#   bash scripts/quickstart.sh [N]        (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec node dist/src/cli/main.js quickstart -n "${1:-10}"
