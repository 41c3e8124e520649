/**
 * A hostile HTTP server on loopback for the fuzzer's pulls and pushes: each request gets a
 * reply picked by a seeded generator (wrong statuses, junk and truncated bodies, fake OCI
 * manifests, bearer challenges pointing back here, redirects to itself, hostile packs). It
 * never stalls: a client's wait on it is bounded by the reply, not by its timeouts.
 */
import { createServer } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { hostileValues } from "./fuzz-values.js";
import type { Rng } from "./rng.js";

export interface JunkServer {
  host: string;
  requests: number;
  close(): Promise<void>;
}

const digest = (r: Rng) => "sha256:" + r.bytes(32).toString("hex");

export async function startJunkServer(r: Rng, token: string, packs: Buffer[]): Promise<JunkServer> {
  const hostile = hostileValues(token);
  const state = { requests: 0 };
  let host = "";
  const replies: Array<(req: IncomingMessage, res: ServerResponse) => void> = [
    (_q, res) =>
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(r.pick(hostile))),
    (_q, res) =>
      res.writeHead(200, { "content-type": "application/octet-stream" }).end(r.bytes(r.int(0, 8192))),
    (_q, res) => {
      // A forkd snapshot artifact's manifest, with hostile paths, sizes and digests.
      const layer = () => ({
        mediaType: "application/vnd.forkd.snapshot.file.v1+zstd",
        digest: r.chance(0.8) ? digest(r) : "sha256:zz",
        size: r.pick([1, 100, 2 ** 40, Number.MAX_SAFE_INTEGER]),
        annotations: {
          "vnd.forkd.file.path": r.pick([
            `../../escape-${token}`,
            "manifest.json",
            "image/rootfs.ext4",
            `snapshots/${token}/memory`,
            `snapshots/${token}/meta.json`,
            "/etc/passwd",
          ]),
          "vnd.forkd.file.sha256": r.bytes(32).toString("hex"),
          "vnd.forkd.file.size": r.pick(["1", "9999999999999999", "0"]),
        },
      });
      res.writeHead(200, { "content-type": "application/vnd.oci.image.manifest.v1+json" }).end(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          artifactType: "application/vnd.forkd.snapshot.v1",
          config: {
            mediaType: "application/vnd.forkd.snapshot.config.v1+json",
            digest: digest(r),
            size: r.pick([2, 4096, 16 << 20]),
          },
          layers: Array.from({ length: r.int(1, 4) }, layer),
          annotations: { "vnd.forkd.snapshot.tag": r.pick([token, `../../escape-${token}`]) },
        }),
      );
    },
    (_q, res) =>
      res
        .writeHead(401, {
          "www-authenticate": `Bearer realm="http://${host}/token",service="fz",scope="repository:x:pull"`,
        })
        .end("{}"),
    (_q, res) =>
      res
        .writeHead(401, {
          "www-authenticate": r.pick([
            'Bearer realm=""',
            "Basic",
            "Bearer ,,,",
            `Bearer realm="file:///etc/passwd"`,
          ]),
        })
        .end(),
    (_q, res) =>
      res
        .writeHead(200, { "content-type": "application/json" })
        .end(JSON.stringify({ token: r.pick(hostile), expires_in: -1 })),
    (_q, res) =>
      res.writeHead(r.pick([404, 500, 502, 503, 429, 400]), { "content-type": "text/plain" }).end("junk"),
    (_q, res) => res.writeHead(307, { location: `http://${host}/loop-${r.int(0, 9)}` }).end(),
    (_q, res) =>
      res
        .writeHead(202, {
          location: r.pick([`http://${host}/upload`, "/upload?x=1", "::not a url::"]),
          "docker-upload-uuid": "x",
        })
        .end(),
    (_q, res) => res.writeHead(201, { "docker-content-digest": digest(r) }).end(),
    (_q, res) => {
      // A declared length the body does not reach.
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": "100000" });
      res.end(r.bytes(10));
      res.socket?.destroy();
    },
    (_q, res) => res.writeHead(200, { "content-type": "application/zstd" }).end(r.pick(packs)),
  ];
  const server = createServer((req, res) => {
    state.requests++;
    req.resume(); // bodies (pushed blobs) are read and dropped
    req.on("end", () => r.pick(replies)(req, res));
    req.on("error", () => res.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    host,
    get requests() {
      return state.requests;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
