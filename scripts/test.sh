#!/usr/bin/env bash
# The whole test suite: install, then typecheck + lint + format check, guest agent tests,
# unit tests and integration tests that boot real VMs (TCG on hosts without KVM).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
echo "== typecheck, lint, format"
npx tsc -p tsconfig.json --noEmit
npx tsc -p console/tsconfig.json --noEmit
npx eslint .
npx prettier --check . >/dev/null || { npx prettier --check .; exit 1; }
echo "== guest agent tests (on the host, over a socketpair)"
make -s -C guest/agent test
echo "== unit and integration tests"
node --test --test-concurrency=1 --test-timeout=900000 dist/test/unit/ dist/test/integration/
