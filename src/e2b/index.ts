/**
 * What e2b offers the daemon: E2B's API (control plane, sandbox plane, envd, the code interpreter)
 * over forkd's application layer. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { AccessTokens } from "./access-token.js";
export type { E2bServices } from "./context.js";
export { interpreterHandler } from "./interpreter/handler.js";
export { createE2bHandler, createE2bUpgradeHandler, listenE2b } from "./server.js";
