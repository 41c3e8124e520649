#!/usr/bin/env bash
# Everything forkd needs on a fresh Debian 12 machine: host packages (QEMU 10 from
# bookworm-backports, debootstrap, ...), npm dependencies, the TypeScript build and the guest
# agent, and the web console's front end (console/dist). Idempotent and quick when everything is already there. The guest image is built (and
# cached by content hash under /var/cache/forkd) by the first snapshot.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-host.sh

# npm dependencies: reinstall only when the lockfile changed.
stamp=node_modules/.forkd-lock-sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "install: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi

echo "install: building the TypeScript SDK, the MCP server, the daemon, the native helpers and the guest agent"
npx tsc -p sdk/typescript
npx tsc -p mcp
npx tsc -p tsconfig.json
make -s -C native
make -s -C guest/agent
make -s -C guest/rand
echo "install: building the web console (console/dist)"
npm run -s -w @forkd/console build >/dev/null
