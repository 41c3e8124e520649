/**
 * What peer offers the daemon: the routes another node of the cluster pulls snapshots through
 * (/peer/v1/: a chain's manifest and files by sha256), behind the cluster secret's peer bearer.
 * Other folders import this folder through this file alone (test/unit/layering.test.ts).
 */
export { createPeerApp } from "./app.js";
