/**
 * The cluster secret (FORKD_CLUSTER_SECRET_FILE): a file every node and gateway of a cluster
 * shares, readable by its owner alone (no group or other permission bits) and at least 32 bytes
 * long (trailing whitespace, such as the newline `openssl rand -hex 32 >` writes, is not part of
 * it). It is read once, at start; a bad one stops the daemon with a clear error.
 *
 * The secret itself never crosses the network: each use has its own bearer,
 * HMAC-SHA256(secret, purpose) in hex (`forkd-peer/1`: a node asking a peer for snapshot files,
 * src/peer/; `forkd-admitted/1`: a gateway's fork already counted against the tenant's quota),
 * compared in constant time. No API token is one of these bearers, and none of
 * these opens the API.
 */
import { createHmac, createHash, timingSafeEqual } from "node:crypto";
import { open } from "node:fs/promises";
import { ForkdError } from "../util/index.js";

/** A node's requests to a peer's /peer/v1/ routes. */
export const PEER_PURPOSE = "forkd-peer/1";

/**
 * A gateway's fork sent to a node, whose children the gateway already reserved against the
 * tenant's quota across the cluster (src/cluster/quota.ts): sent as `X-Forkd-Admitted: Bearer
 * <its bearer>`, beside the caller's own credential. A fork without it (a tenant calling a node
 * directly) is reserved by the node itself.
 */
export const ADMITTED_PURPOSE = "forkd-admitted/1";
export const ADMITTED_HEADER = "x-forkd-admitted";

/** The secret's least length in bytes, and the most a secret file may hold. */
const MIN_BYTES = 32;
const MAX_BYTES = 64 << 10;

const digest = (s: string): Buffer => createHash("sha256").update(s).digest();

export class ClusterSecret {
  private constructor(private readonly key: Buffer) {}

  /** Reads and checks the secret file at `path` (mode, length). */
  static async read(path: string, name = "FORKD_CLUSTER_SECRET_FILE"): Promise<ClusterSecret> {
    const bad = (why: string) =>
      new ForkdError("invalid_argument", `${name} ${path}: ${why}`, { field: name });
    const fh = await open(path, "r").catch((e: unknown) => {
      throw bad(`cannot be read: ${(e as NodeJS.ErrnoException).code ?? String(e)}`);
    });
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw bad("is not a regular file");
      if ((st.mode & 0o077) !== 0)
        throw bad(`mode ${(st.mode & 0o777).toString(8)} lets others read it: chmod 600 it`);
      if (st.size > MAX_BYTES) throw bad(`is larger than ${MAX_BYTES} bytes`);
      const raw = (await fh.readFile()).toString("latin1").replace(/\s+$/, "");
      const key = Buffer.from(raw, "latin1");
      if (key.length < MIN_BYTES)
        throw bad(`holds ${key.length} bytes; a cluster secret needs at least ${MIN_BYTES}`);
      return new ClusterSecret(key);
    } finally {
      await fh.close();
    }
  }

  /** A secret from bytes (tests; at least 32). */
  static of(key: Buffer): ClusterSecret {
    if (key.length < MIN_BYTES) throw new ForkdError("invalid_argument", "a cluster secret needs 32 bytes");
    return new ClusterSecret(Buffer.from(key));
  }

  /** The secret's bytes, for keys derived from it in this process (sealed sessions); never sent. */
  bytes(): Buffer {
    return Buffer.from(this.key);
  }

  /** The bearer of `purpose`: HMAC-SHA256(secret, purpose), hex. */
  bearer(purpose: string): string {
    return createHmac("sha256", this.key).update(purpose).digest("hex");
  }

  /** Whether `authorization` (the header's value) is `Bearer <the bearer of purpose>`; constant time. */
  accepts(authorization: string | undefined | null, purpose: string): boolean {
    const m = /^Bearer ([^\s]{1,512})$/.exec(authorization ?? "");
    const given = m?.[1] ?? "";
    // Digests of both: equal lengths whatever was sent, and nothing learnt from the timing.
    return timingSafeEqual(digest(given), digest(this.bearer(purpose))) && m !== null;
  }
}
