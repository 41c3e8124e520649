/**
 * A recording proxy in front of a test registry (registry.ts), for pull tests: it logs every
 * request (to count blob fetches), and can stand in for an authenticating registry: with
 * `bearer`, requests without its token get 401 and a Bearer challenge whose realm is its own
 * token endpoint (anonymous tokens, as Docker Hub's flow, or for `tokenCredentials` only), which
 * `refuseTokens` makes refuse.
 */
import { createServer } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Readable } from "node:stream";
import type { ReadableStream as WebReadable } from "node:stream/web";

export interface RegistryProxy {
  /** host:port to put in references (the address it listens on, or `advertise`). */
  host: string;
  port: number;
  requests: { method: string; path: string; authorized: boolean }[];
  tokenRequests: URLSearchParams[];
  /** GETs of /v2/<repo>/blobs/<digest>. */
  blobGets(digest?: string): number;
  close(): Promise<void>;
}

export const PROXY_TOKEN = "forkd-test-token";

export async function startRegistryProxy(
  upstream: string,
  o: {
    bearer?: boolean;
    refuseTokens?: boolean;
    /** The token service wants these credentials (Basic), as a private repository's does. */
    tokenCredentials?: { username: string; password: string };
    /** Blob GETs are answered this much later (to order concurrent pulls in a test). */
    blobDelayMs?: number;
    listen?: string;
    advertise?: string;
  } = {},
): Promise<RegistryProxy> {
  const requests: RegistryProxy["requests"] = [];
  const tokenRequests: URLSearchParams[] = [];
  let self = "";
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://x");
    if (url.pathname === "/token") {
      tokenRequests.push(url.searchParams);
      const c = o.tokenCredentials;
      const want = c ? `Basic ${Buffer.from(`${c.username}:${c.password}`).toString("base64")}` : null;
      if (o.refuseTokens || (want !== null && req.headers.authorization !== want)) {
        res.writeHead(403, { "content-type": "application/json" }).end('{"details":"no"}');
        return;
      }
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ token: PROXY_TOKEN }));
      return;
    }
    const authorized = req.headers.authorization === `Bearer ${PROXY_TOKEN}`;
    requests.push({ method: req.method ?? "", path: url.pathname, authorized });
    if (o.bearer && !authorized) {
      const repo = /^\/v2\/(.+)\/(?:manifests|blobs)\//.exec(url.pathname)?.[1];
      res
        .writeHead(401, {
          "content-type": "application/json",
          "www-authenticate": `Bearer realm="http://${self}/token",service="forkd-test"${repo ? `,scope="repository:${repo}:pull"` : ""}`,
        })
        .end('{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}');
      return;
    }
    if (o.blobDelayMs && req.method === "GET" && url.pathname.includes("/blobs/")) {
      await new Promise((r) => setTimeout(r, o.blobDelayMs));
    }
    const headers: Record<string, string> = {};
    if (typeof req.headers.accept === "string") headers.accept = req.headers.accept;
    const up = await fetch(`http://${upstream}${req.url ?? "/"}`, {
      method: req.method ?? "GET",
      headers,
      redirect: "manual",
    });
    const out: Record<string, string> = {};
    for (const k of ["content-type", "content-length", "docker-content-digest", "location"]) {
      const v = up.headers.get(k);
      if (v !== null) out[k] = v;
    }
    res.writeHead(up.status, out);
    if (!up.body || req.method === "HEAD") {
      res.end();
      return;
    }
    Readable.fromWeb(up.body as WebReadable<Uint8Array>).pipe(res);
  };
  const server = createServer((req, res) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
  });
  await new Promise<void>((r) => server.listen(0, o.listen ?? "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  self = `${o.advertise ?? o.listen ?? "127.0.0.1"}:${port}`;
  return {
    host: self,
    port,
    requests,
    tokenRequests,
    blobGets: (digest) =>
      requests.filter(
        (r) =>
          r.method === "GET" &&
          r.path.includes("/blobs/") &&
          (digest === undefined || r.path.endsWith(`/${digest}`)),
      ).length,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
