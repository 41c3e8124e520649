/**
 * What metrics offers: the Prometheus registry and the daemon's metrics (latencies, memory,
 * per-sandbox usage), and a cluster gateway's. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { SharingProbe, readSmapsRollup } from "./memory.js";
export { GatewayMetrics } from "./gateway-metrics.js";
export type { GatewayMetricsSources } from "./gateway-metrics.js";
export { Metrics } from "./metrics.js";
export { parseProcStat, sampleUsage } from "./sandbox-usage.js";
