/**
 * What daemon offers: the daemon itself, run in this process (`forkd daemon`), and a cluster's
 * gateway (`forkd gateway`). Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { runGateway } from "./gateway.js";
export { runDaemon } from "./main.js";
