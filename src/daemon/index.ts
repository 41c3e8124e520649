/**
 * What daemon offers: the daemon itself, run in this process (`forkd daemon`). Other folders
 * import this folder through this file alone (test/unit/layering.test.ts).
 */
export { runDaemon } from "./main.js";
