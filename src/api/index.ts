/**
 * What api offers the daemon: the REST API (its contract, routes, views and edge) over forkd's
 * application layer. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { createApp } from "./app.js";
export type { ApiServices } from "./services.js";
export { TERMINAL_UPGRADE } from "./terminal-upgrade.js";
export { snapshotView } from "./views/snapshot.js";
