/**
 * What gateway offers: `forkd gateway`, the cluster's front door (forkd's REST API, E2B's API and
 * the web console over every node, stateless, any number of replicas; docs/cluster.md,
 * "Gateway"). Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { startGateway } from "./gateway.js";
export type { GatewayOptions, RunningGateway } from "./gateway.js";
export type { BearerAuth, GatewayBounds } from "./context.js";
