#!/usr/bin/env node
/**
 * forkd-mcp: the MCP server over stdio (default) or streamable HTTP (--http PORT, on 127.0.0.1
 * unless --host). stdout is the protocol; logs go to stderr. The daemon is found like the SDK
 * finds it: FORKD_URL + FORKD_TOKEN, else the unix socket (FORKD_SOCKET).
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { createServer } from "./server.js";
import { serveHttp } from "./http.js";

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

async function main(): Promise<void> {
  const port = arg("--http");
  if (port !== undefined) {
    const n = Number(port);
    if (!Number.isInteger(n) || n < 0 || n > 65535) throw new Error(`--http needs a port, got ${port}`);
    const host = arg("--host") ?? "127.0.0.1";
    if (!["127.0.0.1", "::1", "localhost"].includes(host)) {
      process.stderr.write(
        `forkd-mcp: warning: ${host} is not loopback and this endpoint has no authentication of its own; ` +
          "put it behind an authenticating proxy\n",
      );
    }
    const http = await serveHttp(n, host);
    const addr = http.address();
    process.stderr.write(
      `forkd-mcp: streamable HTTP on http://${host}:${typeof addr === "object" && addr ? addr.port : n}/mcp\n`,
    );
    return;
  }
  await createServer().connect(new StdioServerTransport());
}

main().catch((e: unknown) => {
  process.stderr.write(`forkd-mcp: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exit(1);
});
