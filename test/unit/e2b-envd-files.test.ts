/**
 * envd's /files routes and lease discipline against hostile or broken clients, over the host
 * stand-in for the guest agent (test/helpers/envd-host.ts): a signed URL does only what it was
 * signed for, multipart parts are streamed, a client that hangs up or stalls mid-upload frees
 * its lease, a failed process start frees its lease; a download names its user to the agent,
 * or, with an agent older than file users, is read by `cat` run as the user.
 */
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import type { ClientRequest, IncomingMessage } from "node:http";
import { existsSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Process } from "../../src/e2b/envd/gen/process/process_pb.js";
import { envdHost } from "../helpers/envd-host.js";
import type { EnvdHost } from "../helpers/envd-host.js";

let host: EnvdHost;
const BOUNDARY = "----forkdtestboundary";
/** "other:" — the Basic user E2B's SDK sends, here naming another account. */
const BASIC_OTHER = `Basic ${Buffer.from("other:").toString("base64")}`;

const waitFor = async (ok: () => boolean, what: string, ms = 5000) => {
  const t0 = Date.now();
  while (!ok()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting: ${what} (leases: ${host.leased()})`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

const partHead = (filename: string) =>
  `--${BOUNDARY}\r\ncontent-disposition: form-data; name="file"; filename="${filename}"\r\n` +
  `content-type: application/octet-stream\r\n\r\n`;
const multipart = (parts: { filename: string; data: string }[]) =>
  Buffer.from(parts.map((p) => `${partHead(p.filename)}${p.data}\r\n`).join("") + `--${BOUNDARY}--\r\n`);

function open(
  method: string,
  path: string,
  headers: Record<string, string>,
): { req: ClientRequest; res: Promise<{ status: number; body: string }> } {
  const u = new URL(path, host.url);
  const req = request(u, { method, headers });
  const res = new Promise<{ status: number; body: string }>((resolve, reject) => {
    req.on("response", (r: IncomingMessage) => {
      let body = "";
      r.setEncoding("utf8");
      r.on("data", (d: string) => (body += d));
      r.on("end", () => resolve({ status: r.statusCode ?? 0, body }));
      r.on("error", reject);
    });
    req.on("error", reject);
  });
  return { req, res };
}

async function send(method: string, path: string, headers: Record<string, string>, body?: Buffer) {
  const { req, res } = open(method, path, headers);
  req.end(body);
  return res;
}

before(async () => {
  host = await envdHost({ bodyIdleMs: 300 });
});
after(async () => host.close());

test("a signed upload URL writes only as the signed user, every part to the signed path", async () => {
  const body = multipart([
    { filename: join(host.home, "evil1"), data: "one" },
    { filename: join(host.home, "evil2"), data: "two" },
  ]);
  const r = await send(
    "POST",
    "/files?path=signed.txt&username=user&signature=v1_abc",
    { authorization: BASIC_OTHER, "content-type": `multipart/form-data; boundary=${BOUNDARY}` },
    body,
  );
  assert.equal(r.status, 200, r.body);
  const written = JSON.parse(r.body) as { path: string }[];
  assert.deepEqual(
    written.map((w) => w.path),
    [join(host.home, "signed.txt"), join(host.home, "signed.txt")],
  );
  assert.equal(existsSync(join(host.home, "evil1")), false, "a part's own filename is not used");
  assert.equal(existsSync(join(host.home, "evil2")), false);
  assert.equal(existsSync(join(host.home, "other", "signed.txt")), false, "not the Basic user's home");
  assert.equal(await readFile(join(host.home, "signed.txt"), "utf8"), "two");
  // Unsigned, the same request still acts as the Basic user and uses the parts' names.
  const plain = await send(
    "POST",
    "/files",
    { authorization: BASIC_OTHER, "content-type": `multipart/form-data; boundary=${BOUNDARY}` },
    multipart([
      { filename: "u1.txt", data: "a" },
      { filename: "u2.txt", data: "b" },
    ]),
  );
  assert.equal(plain.status, 200, plain.body);
  assert.equal(await readFile(join(host.home, "other", "u2.txt"), "utf8"), "b");
});

test("a signed download URL reads as the signed user (its home), not the Basic one", async () => {
  await mkdir(join(host.home, "other"), { recursive: true });
  await writeFile(join(host.home, "d.txt"), "user's");
  await writeFile(join(host.home, "other", "d.txt"), "other's");
  const signed = await send("GET", "/files?path=d.txt&username=user&signature=v1_abc", {
    authorization: BASIC_OTHER,
  });
  assert.equal(signed.status, 200);
  assert.equal(signed.body, "user's");
  const unsigned = await send("GET", "/files?path=d.txt", { authorization: BASIC_OTHER });
  assert.equal(unsigned.body, "other's");
});

test("multipart parts are streamed: the first is written before the body has ended", async () => {
  const first = join(host.home, "stream-1.txt");
  const { req, res } = open("POST", "/files", {
    "content-type": `multipart/form-data; boundary=${BOUNDARY}`,
  });
  req.write(`${partHead(first)}first part\r\n${partHead(join(host.home, "stream-2.txt"))}sec`);
  await waitFor(() => existsSync(first), "the first part on disk while the body is still open", 3000);
  req.end(`ond\r\n--${BOUNDARY}--\r\n`);
  const r = await res;
  assert.equal(r.status, 200, r.body);
  assert.equal(await readFile(first, "utf8"), "first part");
  assert.equal(await readFile(join(host.home, "stream-2.txt"), "utf8"), "second");
});

test("a multipart body with too many parts, or truncated, is refused and nothing half-written", async () => {
  const truncated = Buffer.concat([
    Buffer.from(partHead(join(host.home, "trunc.txt"))),
    Buffer.from("no end boundary"),
  ]);
  const r = await send(
    "POST",
    "/files",
    { "content-type": `multipart/form-data; boundary=${BOUNDARY}` },
    truncated,
  );
  assert.equal(r.status, 400, r.body);
  assert.equal(existsSync(join(host.home, "trunc.txt")), false);
  const many = multipart(
    Array.from({ length: 1001 }, (_, i) => ({ filename: join(host.home, "many", `${i}`), data: "x" })),
  );
  const m = await send(
    "POST",
    "/files",
    { "content-type": `multipart/form-data; boundary=${BOUNDARY}` },
    many,
  );
  assert.equal(m.status, 400, m.body);
  assert.match(m.body, /more than 1000 files/);
  assert.equal(host.leased(), 0);
});

for (const kind of ["plain", "gzip", "multipart", "multipart+gzip"] as const) {
  test(`an upload (${kind}) whose client hangs up mid-body frees its lease`, async () => {
    const headers: Record<string, string> = {};
    if (kind.startsWith("multipart")) headers["content-type"] = `multipart/form-data; boundary=${BOUNDARY}`;
    else headers["content-type"] = "application/octet-stream";
    if (kind.endsWith("gzip")) headers["content-encoding"] = "gzip";
    const raw = kind.startsWith("multipart")
      ? Buffer.concat([Buffer.from(partHead(join(host.home, `hang-${kind}`))), Buffer.alloc(200_000, 97)])
      : Buffer.alloc(200_000, 97);
    const data = kind.endsWith("gzip") ? gzipSync(raw).subarray(0, 200) : raw.subarray(0, 100_000);
    const { req, res } = open("POST", `/files?path=hang-${kind}`, headers);
    res.catch(() => undefined);
    req.write(data);
    await waitFor(() => host.leased() === 1, "the upload under way");
    req.destroy();
    await waitFor(() => host.leased() === 0, "the lease released after the hang-up", 3000);
    assert.equal(existsSync(join(host.home, `hang-${kind}`)), false, "nothing half-written");
  });
}

test("an upload whose client stalls is ended after the idle timeout and frees its lease", async () => {
  const { req, res } = open("POST", "/files?path=stall.bin", {
    "content-type": "application/octet-stream",
    "content-encoding": "gzip",
  });
  const r = res.catch((e: unknown) => e);
  req.write(gzipSync(Buffer.alloc(100_000, 1)).subarray(0, 100));
  await waitFor(() => host.leased() === 1, "the upload under way");
  await waitFor(() => host.leased() === 0, "the stalled upload ended", 3000);
  req.destroy();
  await r;
  assert.equal(existsSync(join(host.home, "stall.bin")), false);
});

test("process.Start with a cwd it cannot resolve fails and frees its lease", async () => {
  const client = createClient(Process, createConnectTransport({ baseUrl: host.url, httpVersion: "1.1" }));
  for (const cwd of ["a\0b", "/" + "x".repeat(5000)]) {
    await assert.rejects(
      (async () => {
        for await (const _ of client.start({ process: { cmd: "/bin/true", args: [], envs: {}, cwd } }))
          void _;
      })(),
      /NUL|longer than 4096/,
    );
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(host.leased(), 0, `no lease kept after a start with cwd ${JSON.stringify(cwd.slice(0, 8))}`);
  }
});

test("a download as a user other than root: the agent reads it as the user; an older agent's is cat as the user", async () => {
  for (const fileUsers of [true, false]) {
    const h = await envdHost({ userUid: 4242, fileUsers });
    try {
      const path = join(h.home, "data.txt");
      await writeFile(path, "the user's bytes");
      const r = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = request(
          new URL(`/files?path=${encodeURIComponent(path)}&username=user`, h.url),
          (res) => {
            let body = "";
            res.setEncoding("utf8");
            res.on("data", (d: string) => (body += d));
            res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        req.on("error", reject);
        req.end();
      });
      assert.equal(r.status, 200, r.body);
      assert.equal(r.body, "the user's bytes");
      const cat = h.log.execs.find((e) => e.argv[0] === "cat");
      if (fileUsers) {
        assert.deepEqual(h.log.reads, [{ path, user: "user" }], "the agent's READ names the user");
        assert.equal(cat, undefined);
      } else {
        assert.deepEqual(h.log.reads, [], "an agent that would read as root is not asked to");
        assert.deepEqual(cat, { argv: ["cat", "--", path], user: "user" });
      }
    } finally {
      await h.close();
    }
  }
});
