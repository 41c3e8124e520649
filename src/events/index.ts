/**
 * What events offers: the bus of sandbox and snapshot events, its SSE stream and usage accounting.
 * Other folders import this folder through this file alone (test/unit/layering.test.ts).
 */
export { EventBus } from "./bus.js";
export type { CoreEvent } from "./bus.js";
export { sseComment, sseEvent } from "./sse.js";
export { UsageSampler } from "./usage.js";
