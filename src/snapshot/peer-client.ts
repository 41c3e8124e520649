/**
 * The client side of the peer routes (src/peer/): a holder's manifest of a key, and a file's
 * bytes by sha256 from a given offset (`Range: bytes=N-`), written into a staging file as they
 * stream. Every request carries the cluster's peer bearer; plain http is allowed to any host (a
 * node's address is the operator's, and every byte is verified against its sha256), https when
 * a node's address says so: its certificate verified against Node's CAs and the node's
 * FORKD_NODE_CA_FILE (`trust`), as a gateway verifies it. Each exchange is bounded: an idle timeout (no byte for `idleMs`),
 * a floor on the rate once past a grace period (a peer trickling bytes is as stuck as one sending
 * none), the manifest's size, and a blob never longer than the size it must have.
 */
import type { Hash } from "node:crypto";
import type { SecureContext } from "node:tls";
import type { FileHandle } from "node:fs/promises";
import { bodyStream, discard, readLimited, send } from "../registry/index.js";
import type { Sent } from "../registry/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { FileSum } from "./file-sums.js";
import { parsePeerManifest } from "./peer-manifest.js";
import type { PeerManifest } from "./peer-manifest.js";

/** A node that holds a snapshot: its id and the URL its peers reach it at (FORKD_NODE_ADDR). */
export interface Holder {
  node: string;
  url: string;
}

export interface PeerClientOptions {
  /** `Authorization: Bearer <this>` (the cluster secret's peer bearer: access/cluster-secret.ts). */
  bearer: string;
  /** A request making no progress for this long fails (ms). */
  idleMs: number;
  /** Bytes per second a blob must average once `graceMs` have passed (0: no floor). */
  minRate: number;
  graceMs: number;
  /** The CAs an https peer's certificate must chain to (FORKD_NODE_CA_FILE's and Node's; absent: Node's). */
  trust?: SecureContext;
}

/** A peer manifest is at most this large (as a pack's). */
const MAX_MANIFEST = 16 << 20;
/** Pieces of a blob written at once; all-zero pieces are left as holes. */
const PIECE = 64 << 10;
const ZERO = Buffer.alloc(PIECE);

const urlOf = (h: Holder, path: string): URL => {
  let u: URL;
  try {
    u = new URL(path, h.url);
  } catch {
    throw new ForkdError(
      "invalid_argument",
      `node ${h.node}: not a URL: ${JSON.stringify(h.url.slice(0, 200))}`,
    );
  }
  if (u.protocol !== "http:" && u.protocol !== "https:")
    throw new ForkdError("invalid_argument", `node ${h.node}: ${u.protocol} is not http or https`);
  if (u.username || u.password)
    throw new ForkdError("invalid_argument", `node ${h.node}: a node's URL carries no credentials`);
  return u;
};

async function get(
  h: Holder,
  path: string,
  what: string,
  o: PeerClientOptions,
  range?: string,
): Promise<Sent> {
  return send(urlOf(h, path), {
    method: "GET",
    headers: { authorization: `Bearer ${o.bearer}`, ...(range ? { range } : {}) },
    // Any host: a node's address is the operator's (the cluster's records), never a tenant's.
    policy: { insecure: true },
    idleMs: o.idleMs,
    ...(o.trust ? { trust: o.trust } : {}),
    what: `${what} from ${h.node}`,
  });
}

/** A refusal by a holder, as the caller can tell it: not there (404), or the holder failing. */
async function refused(s: Sent, what: string, h: Holder): Promise<ForkdError> {
  const body = await readLimited(s, 4096).catch(() => Buffer.alloc(0));
  const status = s.res.status;
  const why = body.toString("utf8").slice(0, 300);
  return new ForkdError(
    status === 404 ? "not_found" : "unavailable",
    `${what} from ${h.node}: ${status}${why ? ` ${why}` : ""}`,
    { node: h.node, status },
  );
}

/** `key`'s manifest as holder `h` has it (checked: peer-manifest.ts), for a pull. */
export async function fetchPeerManifest(h: Holder, key: string, o: PeerClientOptions): Promise<PeerManifest> {
  const what = `the manifest of ${key}`;
  const s = await get(h, `/peer/v1/snapshots/${encodeURIComponent(key)}/manifest`, what, o);
  if (s.res.status !== 200) throw await refused(s, what, h);
  const m = parsePeerManifest((await readLimited(s, MAX_MANIFEST)).toString("utf8"));
  if (m.tag !== key)
    throw new ForkdError("invalid_argument", `node ${h.node} answered the manifest of ${m.tag} for ${key}`);
  return m;
}

/** Where a blob's download stands: bytes staged so far (`pos`), hashed as they came. */
export interface BlobState {
  /** What the file must be: its size and sha256 (the holder's, as its manifest lists it). */
  target: FileSum;
  pos: number;
  hash: Hash;
  /** Bytes received over the wire, including any a failure made useless. */
  wire: number;
}

/** `Content-Range: bytes START-END/SIZE` → [start, end, size], or null. */
function contentRange(v: string | null): [number, number, number] | null {
  const m = /^bytes (\d{1,16})-(\d{1,16})\/(\d{1,16})$/.exec(v?.trim() ?? "");
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : null;
}

/**
 * Streams the rest of `st.target` (from `st.pos`) from holder `h` into `fh`: asks for the bytes
 * from `st.pos` (`Range: bytes=N-`), checks the reply says exactly those (206 with its
 * Content-Range; a 200 restarts the file from its first byte), writes each piece at its place
 * (all-zero pieces left as holes) and hashes it. `st` is updated as bytes arrive, so a failure
 * (reset, idle, too slow, too long) leaves it where a next attempt resumes. Returns once the
 * holder sent the last byte; the caller checks the sum.
 */
export async function fetchBlob(
  h: Holder,
  st: BlobState,
  fh: FileHandle,
  o: PeerClientOptions,
  onBytes: (n: number) => void,
  restart: () => Promise<void>,
): Promise<void> {
  const { size, sha256 } = st.target;
  const what = `sha256:${sha256.slice(0, 12)}…`;
  const s = await get(
    h,
    `/peer/v1/blobs/sha256:${sha256}`,
    what,
    o,
    st.pos > 0 ? `bytes=${st.pos}-` : undefined,
  );
  const fail = async (why: string): Promise<never> => {
    await discard(s);
    throw new ForkdError("invalid_argument", `${what} from ${h.node}: ${why}`, { node: h.node });
  };
  let start: number;
  if (s.res.status === 206) {
    const r = contentRange(s.res.headers.get("content-range"));
    if (!r || r[0] !== st.pos || r[1] !== size - 1 || r[2] !== size)
      return fail(
        `answered ${s.res.headers.get("content-range") ?? "no range"} for bytes ${st.pos}- of ${size}`,
      );
    start = st.pos;
  } else if (s.res.status === 200) {
    if (st.pos > 0) await restart(); // it sends the whole file: start again from its first byte
    start = 0;
  } else {
    throw await refused(s, what, h);
  }
  const declared = s.res.headers.get("content-length");
  if (declared !== null && Number(declared) !== size - start)
    return fail(`announces ${declared} bytes, not ${size - start}`);
  const began = Date.now();
  const body = bodyStream(s);
  try {
    for await (const chunk of body as AsyncIterable<Buffer>) {
      if (st.pos + chunk.length > size)
        throw new ForkdError("invalid_argument", `${what} from ${h.node}: more than its ${size} bytes`);
      st.wire += chunk.length;
      onBytes(chunk.length);
      st.hash.update(chunk);
      for (let at = 0; at < chunk.length; at += PIECE) {
        const piece = chunk.subarray(at, at + PIECE);
        if (!piece.equals(ZERO.subarray(0, piece.length)))
          await fh.write(piece, 0, piece.length, st.pos + at);
      }
      st.pos += chunk.length;
      const ms = Date.now() - began;
      if (o.minRate > 0 && ms > o.graceMs && ((st.pos - start) * 1000) / ms < o.minRate)
        throw new ForkdError("timeout", `${what} from ${h.node}: slower than ${o.minRate} bytes/s`, {
          node: h.node,
        });
    }
  } catch (e) {
    body.destroy();
    if (e instanceof ForkdError) throw e;
    throw new ForkdError("unavailable", `${what} from ${h.node}: ${errorMessage(e)}`, { node: h.node }, e);
  }
  if (st.pos !== size)
    throw new ForkdError("unavailable", `${what} from ${h.node}: broke off at byte ${st.pos} of ${size}`, {
      node: h.node,
    });
}
