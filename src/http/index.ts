/**
 * What http offers the front doors: HTTP plumbing they share (the reverse proxy, reply streams
 * that survive a hang-up, WebSocket upgrades, the console's built front end, which sandbox port an E2B sandbox-plane request is for,
 * E2B's error reply, a whole JSON reply on a raw response). Other folders import
 * this folder through this file alone (test/unit/layering.test.ts).
 */
export { FAVICON_ICO, SECURITY_HEADERS, consoleDist, page, serveAsset } from "./console-assets.js";
export type { AssetReply } from "./console-assets.js";
export { e2bErrorReply } from "./e2b-error.js";
export type { E2bErrorReply } from "./e2b-error.js";
export type { HeaderFilter, PassedCredentials } from "./proxy-headers.js";
export { proxyRequest } from "./proxy-request.js";
export { proxyUpgrade } from "./proxy-upgrade.js";
export { clientGone, replyStream } from "./reply-stream.js";
export { sandboxTarget } from "./sandbox-route.js";
export { sendJson } from "./send-json.js";
export type { SandboxTarget } from "./sandbox-route.js";
export type { ReplySink } from "./reply-stream.js";
export { connectTo, overTls, readyEvent, requestTo, upstreamAt } from "./upstream.js";
export type { Upstream, UpstreamTls } from "./upstream.js";
export { wsUpgradeHandler } from "./ws-upgrade.js";
export type { UpgradeTargets, WsUpgrade } from "./ws-upgrade.js";
