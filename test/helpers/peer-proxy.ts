/**
 * A proxy in front of a node's peer routes (src/peer/), for pull tests: it records every
 * request (path and Range) and passes manifests through as they are, but can make the blobs it
 * passes misbehave as a failing or hostile peer's would: cut the connection after some bytes,
 * change a byte, send more than the file, announce a wrong length, stall, trickle, or answer 500.
 */
import { createServer, request } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";

export type BlobFault =
  | { kind: "none" }
  /** The connection is destroyed after `bytes` bytes of a blob's body. */
  | { kind: "cut"; bytes: number }
  /** The byte at `at` of each blob's body is changed. */
  | { kind: "corrupt"; at: number }
  /** Each blob's body gets `bytes` more bytes, and no Content-Length. */
  | { kind: "extra"; bytes: number }
  /** Content-Length says one byte more than the body. */
  | { kind: "length" }
  /** `bytes` bytes of the body, then nothing (the connection held open). */
  | { kind: "stall"; bytes: number }
  /** One byte every `everyMs`. */
  | { kind: "trickle"; everyMs: number }
  /** 500 for every blob. */
  | { kind: "error" };

export interface PeerProxy {
  url: string;
  requests: { path: string; range: string | null }[];
  /** Blob requests (of one sha256 when given). */
  blobGets(sha256?: string): { path: string; range: string | null }[];
  fault: BlobFault;
  close(): Promise<void>;
}

export async function startPeerProxy(
  upstream: string,
  fault: BlobFault = { kind: "none" },
): Promise<PeerProxy> {
  const up = new URL(upstream);
  const sockets = new Set<Socket>();
  const timers = new Set<NodeJS.Timeout>();
  const proxy: PeerProxy = {
    url: "",
    requests: [],
    fault,
    blobGets: (sha) =>
      proxy.requests.filter((r) => r.path.startsWith("/peer/v1/blobs/") && (!sha || r.path.endsWith(sha))),
    close: () =>
      new Promise<void>((r) => {
        for (const t of timers) clearTimeout(t);
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
  const handle = (req: IncomingMessage, res: ServerResponse) => {
    const path = req.url ?? "/";
    const range = typeof req.headers.range === "string" ? req.headers.range : null;
    proxy.requests.push({ path, range });
    const f = proxy.fault;
    const blob = path.startsWith("/peer/v1/blobs/");
    if (blob && f.kind === "error") return void res.writeHead(500).end("broken");
    const headers: Record<string, string> = {};
    for (const k of ["authorization", "range"]) {
      const v = req.headers[k];
      if (typeof v === "string") headers[k] = v;
    }
    const upReq = request(
      { host: up.hostname, port: up.port, path, method: req.method, headers },
      (upRes) => {
        const out: Record<string, string> = {};
        for (const [k, v] of Object.entries(upRes.headers)) if (typeof v === "string") out[k] = v;
        if (!blob || f.kind === "none" || (upRes.statusCode ?? 0) >= 300) {
          res.writeHead(upRes.statusCode ?? 502, out);
          upRes.pipe(res);
          return;
        }
        if (f.kind === "extra") delete out["content-length"];
        if (f.kind === "length") out["content-length"] = String(Number(out["content-length"] ?? 0) + 1);
        res.writeHead(upRes.statusCode ?? 502, out);
        let sent = 0;
        if (f.kind === "trickle") {
          // Read it all, then dribble it out.
          const parts: Buffer[] = [];
          upRes.on("data", (c: Buffer) => parts.push(c));
          upRes.on("end", () => {
            const all = Buffer.concat(parts);
            const step = () => {
              if (res.destroyed) return;
              if (sent >= all.length) return void res.end();
              res.write(all.subarray(sent, sent + 1));
              sent++;
              const t = setTimeout(step, f.everyMs);
              timers.add(t);
            };
            step();
          });
          return;
        }
        upRes.on("data", (c: Buffer) => {
          if (f.kind === "cut" || f.kind === "stall") {
            const left = f.bytes - sent;
            if (left <= 0) return;
            res.write(c.subarray(0, left));
            sent += Math.min(left, c.length);
            if (sent >= f.bytes && f.kind === "cut") {
              // After what was written is flushed: the client gets exactly `bytes`, then the end.
              upRes.destroy();
              res.socket?.end();
            }
            return;
          }
          if (f.kind === "corrupt" && f.at >= sent && f.at < sent + c.length) {
            const copy = Buffer.from(c);
            copy[f.at - sent] = (copy[f.at - sent] ?? 0) ^ 0xff;
            c = copy;
          }
          sent += c.length;
          res.write(c);
        });
        upRes.on("end", () => {
          if (f.kind === "stall") return; // held open
          if (f.kind === "extra") res.write(Buffer.alloc(f.bytes, 1));
          res.end();
        });
      },
    );
    upReq.on("error", () => res.destroy());
    upReq.end();
  };
  const server = createServer(handle);
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  proxy.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return proxy;
}
