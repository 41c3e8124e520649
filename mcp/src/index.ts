/** forkd's MCP server as a library: build one with createServer() and connect any transport. */
export { createServer, VERSION } from "./server.js";
export { serveHttp } from "./http.js";
