/**
 * What console offers: the web console's own server for `forkd console` (the built front end and a
 * proxy to the daemon's API over its socket). Other folders import this folder through this file
 * alone (test/unit/layering.test.ts).
 */
export { createConsoleServer, stopConsoleServer } from "./server.js";
