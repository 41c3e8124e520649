/**
 * Streamable HTTP for the MCP server, stateless: each POST gets a fresh server and transport, so
 * no session state lives here (the daemon owns all of it).
 */
import { createServer as createHttpServer } from "node:http";
import type { Server } from "node:http";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import type { ConnectionOpts } from "@forkd/sdk";
import { createServer } from "./server.js";

const MAX_BODY = 8 << 20;

export function serveHttp(port: number, host: string, conn: ConnectionOpts = {}): Promise<Server> {
  const http = createHttpServer((req, res) => {
    if (req.url !== "/mcp") {
      res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not found: use /mcp"}');
      return;
    }
    if (req.method !== "POST") {
      res.writeHead(405, { allow: "POST" }).end();
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY) req.destroy();
      else chunks.push(c);
    });
    req.on("end", () => {
      void (async () => {
        let body: unknown;
        try {
          body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
        } catch {
          res.writeHead(400, { "content-type": "application/json" }).end('{"error":"body is not JSON"}');
          return;
        }
        const server = createServer(conn);
        const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
        res.on("close", () => {
          void transport.close();
          void server.close();
        });
        await server.connect(transport);
        await transport.handleRequest(req, res, body);
      })().catch(() => {
        if (!res.headersSent) res.writeHead(500).end();
      });
    });
  });
  return new Promise((resolve, reject) => {
    http.once("error", reject);
    http.listen(port, host, () => resolve(http));
  });
}
