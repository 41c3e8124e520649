/**
 * The REST API's one route that takes a WebSocket upgrade (a sandbox's terminal): the daemon's
 * upgrade hook (../http/ws-upgrade.ts) runs only it.
 */
import type { UpgradeTargets } from "../http/index.js";

export const TERMINAL_UPGRADE: UpgradeTargets = {
  path: /^\/v1\/sandboxes\/[^/]+\/terminal$/,
  name: "GET /v1/sandboxes/{id}/terminal",
};
