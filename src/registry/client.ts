/**
 * A small OCI Distribution client: the calls a snapshot push and pull need (manifests, blobs,
 * monolithic and chunked uploads, cross-repository mounts), with anonymous, Basic and Bearer
 * token authentication answered from the registry's challenge.
 *
 * The scheme is https; plain http only for loopback hosts or an insecure registry (then https is
 * tried first). Every body read from the registry is bounded; blobs are verified against their
 * digest and size as they stream.
 */
import { createHash } from "node:crypto";
import { Transform } from "node:stream";
import type { Readable } from "node:stream";
import { ForkdError } from "../util/index.js";
import { parseChallenges } from "./challenge.js";
import type { Challenge } from "./challenge.js";
import type { CredentialLookup, Credentials } from "./credentials.js";
import { tenantGuard } from "./reach.js";
import type { Reach, TenantGuard } from "./reach.js";
import { DIGEST_RE, isLoopback } from "./ref.js";
import type { RegistryRef } from "./ref.js";
import { bodyStream, discard, readLimited, send } from "./transport.js";
import type { RequestBody, SchemePolicy, Sent } from "./transport.js";

export interface RegistryOptions {
  /** Plain http allowed to this (non-loopback) registry. */
  insecure: boolean;
  credentials: CredentialLookup;
  /** Blobs up to this size go in one PUT; larger ones in PATCH chunks of this size. */
  chunkBytes: number;
  /** A request making no progress for this long is aborted. */
  idleMs: number;
  /** Tokens are asked for push (and pull) access, else pull only. */
  push: boolean;
  /** A tenant's client: only the addresses this admits (reach.ts), credentials only for named hosts. */
  tenant?: TenantGuard;
}

const MAX_ERROR_BODY = 16 << 10;
const MAX_TOKEN_BODY = 64 << 10;

export class RegistryClient {
  private base: URL | null = null;
  private authorization: string | null = null;
  private readonly policy: SchemePolicy;
  private credentials: Credentials | null | undefined;

  constructor(
    readonly ref: RegistryRef,
    private readonly o: RegistryOptions,
  ) {
    this.policy = { insecure: o.insecure, ...(o.tenant ? { tenant: o.tenant } : {}) };
  }

  private get name(): string {
    return this.ref.name;
  }

  /** Finds the API base URL (https, else http where allowed) with GET /v2/. */
  private async origin(): Promise<URL> {
    if (this.base) return this.base;
    const plainAllowed = this.o.insecure || isLoopback(this.ref.hostname);
    const candidates = [
      `https://${this.ref.apiHost}/`,
      ...(plainAllowed ? [`http://${this.ref.apiHost}/`] : []),
    ];
    let last: unknown;
    for (const c of candidates) {
      const url = new URL(c);
      try {
        const s = await send(new URL("/v2/", url), {
          method: "GET",
          policy: this.policy,
          idleMs: Math.min(this.o.idleMs, 15_000),
          what: `registry ${this.ref.host}`,
        });
        await discard(s);
        // 200, or 401 (authentication comes with the first real request): a registry.
        if (s.res.status === 200 || s.res.status === 401) {
          this.base = url;
          return url;
        }
        last = new ForkdError("unavailable", `registry ${this.ref.host}: GET /v2/ answered ${s.res.status}`);
      } catch (e) {
        last = e;
      }
    }
    throw last instanceof ForkdError
      ? last
      : new ForkdError("unavailable", `registry ${this.ref.host} is not reachable`);
  }

  private async creds(): Promise<Credentials | null> {
    if (this.credentials === undefined) {
      this.credentials = await this.o.credentials(this.ref.host, { namedOnly: this.o.tenant !== undefined });
    }
    return this.credentials;
  }

  /** Answers a 401's challenge: a Bearer token for `scopes`, or Basic credentials. */
  private async authenticate(challenges: Challenge[], scopes: string[]): Promise<boolean> {
    const creds = await this.creds();
    const bearer = challenges.find((c) => c.scheme === "bearer");
    if (bearer) {
      const realm = bearer.params.realm;
      if (!realm) return false;
      let url: URL;
      try {
        url = new URL(realm);
      } catch {
        throw new ForkdError(
          "unavailable",
          `registry ${this.ref.host}: bad token realm ${JSON.stringify(realm.slice(0, 200))}`,
        );
      }
      if (bearer.params.service) url.searchParams.set("service", bearer.params.service);
      for (const s of scopes) url.searchParams.append("scope", s);
      const headers: Record<string, string> = { accept: "application/json" };
      if (creds) headers.authorization = basic(creds);
      const s = await send(url, {
        method: "GET",
        headers,
        policy: this.policy,
        idleMs: Math.min(this.o.idleMs, 30_000),
        what: `registry ${this.ref.host} token`,
      });
      if (s.res.status !== 200) {
        await discard(s);
        throw new ForkdError(
          "invalid_argument",
          `registry ${this.ref.host}: the token service refused ${creds ? "the credentials" : "anonymous access"} (HTTP ${s.res.status})`,
          { registry_status: s.res.status },
        );
      }
      let token: unknown;
      try {
        const j = JSON.parse((await readLimited(s, MAX_TOKEN_BODY)).toString("utf8")) as {
          token?: unknown;
          access_token?: unknown;
        };
        token = j.token ?? j.access_token;
      } catch {
        token = undefined;
      }
      if (typeof token !== "string" || token.length === 0 || /[\r\n]/.test(token)) {
        throw new ForkdError("unavailable", `registry ${this.ref.host}: the token service sent no token`);
      }
      this.authorization = `Bearer ${token}`;
      return true;
    }
    if (challenges.some((c) => c.scheme === "basic") && creds) {
      const h = basic(creds);
      if (this.authorization === h) return false; // already refused
      this.authorization = h;
      return true;
    }
    return false;
  }

  /**
   * A request to the registry, authenticated on demand: a 401 is answered once from its
   * challenge and the request sent again (its body made afresh).
   */
  private async request(
    method: string,
    pathOrUrl: string,
    o: {
      extraScopes?: string[];
      headers?: Record<string, string>;
      body?: () => RequestBody;
      what: string;
    },
  ): Promise<Sent> {
    const base = await this.origin();
    // An upload Location may name another host (storage behind the registry): it gets no
    // credentials of ours.
    const url = new URL(pathOrUrl, base);
    const scopes = [
      `repository:${this.name}:${this.o.push ? "pull,push" : "pull"}`,
      ...(o.extraScopes ?? []),
    ];
    for (let attempt = 0; ; attempt++) {
      const headers = { ...(o.headers ?? {}) };
      if (this.authorization && url.origin === base.origin) headers.authorization = this.authorization;
      const s = await send(url, {
        method,
        headers,
        ...(o.body ? { body: o.body } : {}),
        policy: this.policy,
        idleMs: this.o.idleMs,
        what: `${o.what} (${this.ref.host}/${this.name})`,
      });
      if (s.res.status !== 401 || attempt > 0) return s;
      const challenges = parseChallenges(s.res.headers.get("www-authenticate"));
      await discard(s);
      if (!(await this.authenticate(challenges, scopes))) return s;
    }
  }

  /** An error for an unexpected reply, with the registry's own error code when it gave one. */
  private async fail(s: Sent, what: string): Promise<never> {
    let detail = "";
    let code: string | undefined;
    try {
      const body = await readLimited(s, MAX_ERROR_BODY);
      const j = JSON.parse(body.toString("utf8")) as { errors?: { code?: unknown; message?: unknown }[] };
      const e = j.errors?.[0];
      if (typeof e?.code === "string") code = e.code.slice(0, 64);
      if (typeof e?.message === "string") detail = `: ${e.message.slice(0, 300)}`;
    } catch {
      await discard(s);
    }
    const status = s.res.status;
    const errCode =
      status === 404
        ? "not_found"
        : status === 401 || status === 403 || status === 400
          ? "invalid_argument"
          : "unavailable";
    const why =
      status === 401 ? " (authentication required or refused)" : status === 403 ? " (access denied)" : "";
    throw new ForkdError(
      errCode,
      `${what}: registry ${this.ref.host} answered ${status}${code ? ` ${code}` : ""}${why}${detail}`,
      {
        registry_status: status,
        ...(code ? { registry_code: code } : {}),
      },
    );
  }

  async blobExists(digest: string): Promise<boolean> {
    checkDigest(digest);
    const s = await this.request("HEAD", `/v2/${this.name}/blobs/${digest}`, { what: "HEAD blob" });
    await discard(s);
    if (s.res.status === 200) return true;
    if (s.res.status === 404) return false;
    return this.fail(s, `checking blob ${digest}`);
  }

  /** The manifest `reference` (tag or digest), at most `max` bytes; its digest is computed here. */
  async getManifest(
    reference: string,
    accept: string[],
    max: number,
  ): Promise<{ bytes: Buffer; mediaType: string; digest: string }> {
    const s = await this.request("GET", `/v2/${this.name}/manifests/${reference}`, {
      headers: { accept: accept.join(", ") },
      what: "GET manifest",
    });
    if (s.res.status !== 200) return this.fail(s, `reading manifest ${reference}`);
    const bytes = await readLimited(s, max);
    const digest = `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
    if (DIGEST_RE.test(reference) && reference !== digest) {
      throw new ForkdError(
        "invalid_argument",
        `manifest ${reference}: the registry sent content with digest ${digest}`,
      );
    }
    return {
      bytes,
      mediaType: (s.res.headers.get("content-type") ?? "").split(";")[0]?.trim() ?? "",
      digest,
    };
  }

  async putManifest(reference: string, mediaType: string, bytes: Buffer): Promise<string> {
    const s = await this.request("PUT", `/v2/${this.name}/manifests/${reference}`, {
      body: () => ({ data: bytes, length: bytes.length, type: mediaType }),
      what: "PUT manifest",
    });
    if (s.res.status !== 201 && s.res.status !== 200) return this.fail(s, `writing manifest ${reference}`);
    await discard(s);
    return `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
  }

  /**
   * A blob's content as a stream, verified as it passes: more than `size` bytes, or a different
   * digest at the end, is an error on the stream. The caller consumes it at once (before any
   * other await): a small blob may end, and fail, right away.
   */
  async openBlob(digest: string, size: number): Promise<Readable> {
    checkDigest(digest);
    const s = await this.request("GET", `/v2/${this.name}/blobs/${digest}`, { what: "GET blob" });
    if (s.res.status !== 200) return this.fail(s, `reading blob ${digest}`);
    const declared = s.res.headers.get("content-length");
    if (declared !== null && Number(declared) !== size) {
      await discard(s);
      throw new ForkdError(
        "invalid_argument",
        `blob ${digest}: the registry announces ${declared} bytes, the manifest ${size}`,
      );
    }
    const h = createHash("sha256");
    let seen = 0;
    const verify = new Transform({
      transform(chunk: Buffer, _e, cb) {
        seen += chunk.length;
        if (seen > size)
          return cb(new ForkdError("invalid_argument", `blob ${digest} is larger than its descriptor says`));
        h.update(chunk);
        cb(null, chunk);
      },
      flush(cb) {
        const got = `sha256:${h.digest("hex")}`;
        if (seen !== size || got !== digest) {
          return cb(
            new ForkdError(
              "invalid_argument",
              `blob ${digest} does not match its digest (got ${got}, ${seen} bytes)`,
            ),
          );
        }
        cb();
      },
    });
    const body = bodyStream(s);
    body.on("error", (e) => verify.destroy(e));
    verify.on("close", () => body.destroy());
    return body.pipe(verify);
  }

  /**
   * Makes the blob present in this repository from another repository of the same registry.
   * Returns the upload URL to use when the registry started an upload instead (no mount).
   */
  async mountBlob(
    digest: string,
    from: string,
  ): Promise<{ mounted: true } | { mounted: false; location: string }> {
    checkDigest(digest);
    const q = new URLSearchParams({ mount: digest, from });
    const s = await this.request("POST", `/v2/${this.name}/blobs/uploads/?${q.toString()}`, {
      extraScopes: [`repository:${from}:pull`],
      body: () => ({ data: Buffer.alloc(0), length: 0 }),
      what: "mount blob",
    });
    if (s.res.status === 201) {
      await discard(s);
      return { mounted: true };
    }
    if (s.res.status === 202 && s.res.headers.get("location")) {
      await discard(s);
      return { mounted: false, location: s.res.headers.get("location") ?? "" };
    }
    return this.fail(s, `mounting blob ${digest} from ${from}`);
  }

  /**
   * Uploads a blob of `size` bytes whose content `open(start, end)` streams (end exclusive):
   * one PUT up to the chunk size, else PATCH chunks and a closing PUT. `location` continues an
   * upload session a mount attempt started.
   */
  async uploadBlob(
    digest: string,
    size: number,
    open: (start: number, end: number) => Readable,
    location?: string,
  ): Promise<void> {
    checkDigest(digest);
    let loc = location;
    if (!loc) {
      const s = await this.request("POST", `/v2/${this.name}/blobs/uploads/`, {
        body: () => ({ data: Buffer.alloc(0), length: 0 }),
        what: "start upload",
      });
      if (s.res.status !== 202) return this.fail(s, `starting the upload of ${digest}`);
      await discard(s);
      loc = s.res.headers.get("location") ?? "";
    }
    if (!loc)
      throw new ForkdError("unavailable", `registry ${this.ref.host}: upload started without a Location`);
    const chunk = this.o.chunkBytes;
    if (size > chunk) {
      for (let start = 0; start < size; start += chunk) {
        const end = Math.min(size, start + chunk);
        const s = await this.request("PATCH", loc, {
          headers: { "content-range": `${start}-${end - 1}` },
          body: () => ({ data: open(start, end), length: end - start }),
          what: "upload chunk",
        });
        if (s.res.status !== 202) return this.fail(s, `uploading ${digest} (bytes ${start}-${end - 1})`);
        await discard(s);
        loc = s.res.headers.get("location") ?? loc;
      }
    }
    const url = new URL(loc, await this.origin());
    url.searchParams.set("digest", digest);
    const s = await this.request("PUT", url.toString(), {
      body: () =>
        size > chunk ? { data: Buffer.alloc(0), length: 0 } : { data: open(0, size), length: size },
      what: "upload blob",
    });
    if (s.res.status !== 201) return this.fail(s, `uploading ${digest}`);
    await discard(s);
  }
}

function checkDigest(d: string): void {
  if (!DIGEST_RE.test(d)) throw new ForkdError("invalid_argument", `bad digest ${JSON.stringify(d)}`);
}

const basic = (c: Credentials) => `Basic ${Buffer.from(`${c.username}:${c.password}`).toString("base64")}`;

/** The daemon's registry settings (from its environment; see docs/operations.md). */
export interface RegistrySettings {
  credentials: CredentialLookup;
  /** Hosts (`host[:port]` as written in references) spoken to over plain http. */
  insecureHosts: string[];
  chunkBytes: number;
  idleMs: number;
  /**
   * What a tenant's requests may reach (FORKD_TENANT_REGISTRIES, the host's own addresses);
   * absent: public addresses only, no registry allowed by name.
   */
  tenant?: TenantGuard;
}

/**
 * A client for `ref`; `insecure` (the request's flag) or a listed host allows plain http. A
 * tenant's (`reach`) connects only where reach.ts admits.
 */
export function clientFor(
  ref: RegistryRef,
  s: RegistrySettings,
  o: { insecure: boolean; push: boolean; reach?: Reach },
): RegistryClient {
  return new RegistryClient(ref, {
    insecure: o.insecure || s.insecureHosts.includes(ref.host) || s.insecureHosts.includes(ref.hostname),
    credentials: s.credentials,
    chunkBytes: s.chunkBytes,
    idleMs: s.idleMs,
    push: o.push,
    ...(o.reach === "tenant" ? { tenant: s.tenant ?? tenantGuard([]) } : {}),
  });
}
