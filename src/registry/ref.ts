/**
 * Registry references: `host[:port]/name[:tag][@sha256:<hex>]`, parsed strictly before any
 * request is made. The host is never implied (no Docker Hub default): a reference names where
 * it goes. Grammar after the OCI Distribution spec and Docker's reference package.
 */
import { ForkdError } from "../util/index.js";

export interface RegistryRef {
  /** As written: `registry.example.com`, `127.0.0.1:5000`, `[::1]:5000`. */
  host: string;
  /** Host name without port or brackets (loopback checks, credentials). */
  hostname: string;
  /** Where the API is: `registry-1.docker.io` for `docker.io`, otherwise `host`. */
  apiHost: string;
  /** Repository name: lowercase path components. */
  name: string;
  tag: string | null;
  digest: string | null;
}

const MAX_REF = 512;
const MAX_NAME = 255;
const DOMAIN_PART = "(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])";
const HOST_RE = new RegExp(
  `^(?:(${DOMAIN_PART}(?:\\.${DOMAIN_PART})*)|\\[([0-9A-Fa-f:.]+)\\])(?::(\\d{1,5}))?$`,
);
const COMPONENT_RE = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
export const DIGEST_RE = /^sha256:[a-f0-9]{64}$/;

const bad = (ref: string, why: string) =>
  new ForkdError("invalid_argument", `invalid registry reference ${JSON.stringify(ref)}: ${why}`, {
    field: "ref",
  });

export function parseRef(ref: string): RegistryRef {
  if (typeof ref !== "string" || ref.length === 0 || ref.length > MAX_REF)
    throw bad(String(ref), "bad length");
  if (/[\s\0]/.test(ref) || ref.includes("://")) throw bad(ref, "no scheme, spaces or control characters");
  let rest = ref;
  let digest: string | null = null;
  const at = rest.indexOf("@");
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST_RE.test(digest)) throw bad(ref, "digest must be sha256:<64 hex digits>");
  }
  const slash = rest.indexOf("/");
  if (slash < 0) throw bad(ref, "name the registry host: HOST[:PORT]/NAME[:TAG]");
  const host = rest.slice(0, slash);
  let path = rest.slice(slash + 1);
  const hm = HOST_RE.exec(host);
  if (!hm) throw bad(ref, `bad registry host ${JSON.stringify(host)}`);
  const hostname = (hm[1] ?? hm[2] ?? "").toLowerCase();
  // A first component without '.' or ':' would be a Docker Hub namespace: refuse the guess.
  if (!host.includes(".") && !host.includes(":") && hostname !== "localhost") {
    throw bad(ref, `${JSON.stringify(host)} is not a registry host (give e.g. docker.io/${rest})`);
  }
  if (hm[3] !== undefined && (Number(hm[3]) < 1 || Number(hm[3]) > 65535)) throw bad(ref, "bad port");
  let tag: string | null = null;
  const colon = path.lastIndexOf(":");
  if (colon >= 0) {
    tag = path.slice(colon + 1);
    path = path.slice(0, colon);
    if (!TAG_RE.test(tag)) throw bad(ref, "bad tag");
  }
  if (path.length === 0 || path.length > MAX_NAME) throw bad(ref, "bad repository name length");
  if (!path.split("/").every((c) => COMPONENT_RE.test(c))) {
    throw bad(ref, "repository name: lowercase letters, digits and . _ - between them, / between parts");
  }
  const docker = hostname === "docker.io" || hostname === "index.docker.io";
  return {
    host,
    hostname,
    apiHost: docker ? "registry-1.docker.io" : host,
    name: docker && !path.includes("/") ? `library/${path}` : path,
    tag: tag ?? (digest ? null : "latest"),
    digest,
  };
}

/** What goes after /manifests/: the digest when there is one, else the tag. */
export const reference = (r: RegistryRef): string => r.digest ?? r.tag ?? "latest";

export function formatRef(r: RegistryRef): string {
  return `${r.host}/${r.name}${r.tag ? `:${r.tag}` : ""}${r.digest ? `@${r.digest}` : ""}`;
}

/** Loopback names: plain http to these stays on this machine. */
export function isLoopback(hostname: string): boolean {
  const h = hostname.toLowerCase().replace(/^\[|\]$/g, "");
  return h === "localhost" || h === "::1" || /^127(?:\.\d{1,3}){3}$/.test(h);
}
