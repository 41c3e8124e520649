/**
 * Registry credentials, looked up by host: FORKD_REGISTRY_USER / FORKD_REGISTRY_PASSWORD (for
 * every registry, or only the hosts in FORKD_REGISTRY_HOSTS), else the `auths` of the Docker
 * client's config.json (`auth` = base64 "user:password", or `username` + `password`).
 * Credential helpers (`credsStore`, `credHelpers`) and identity tokens are not supported.
 * Credentials are only ever sent in answer to a registry's challenge, and never logged. For a
 * tenant's request (`namedOnly`) the FORKD_REGISTRY_USER credentials go only to the hosts
 * FORKD_REGISTRY_HOSTS names: without that list they would go to any registry a tenant names.
 */
import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";

export interface Credentials {
  username: string;
  password: string;
}

/**
 * Looks up credentials for a registry host (`host[:port]` as written in the reference);
 * `namedOnly`: only credentials given for this host by name.
 */
export type CredentialLookup = (host: string, o?: { namedOnly?: boolean }) => Promise<Credentials | null>;

const MAX_CONFIG = 1 << 20;

/** Keys of Docker's config: "https://index.docker.io/v1/", "registry.example.com:5000", … */
function normalizeKey(key: string): string {
  const h = key
    .replace(/^[a-z]+:\/\//i, "")
    .replace(/\/.*$/, "")
    .toLowerCase();
  return h === "index.docker.io" || h === "registry-1.docker.io" ? "docker.io" : h;
}

export function credentialsFromEnv(env: NodeJS.ProcessEnv): CredentialLookup {
  const user = env.FORKD_REGISTRY_USER;
  const password = env.FORKD_REGISTRY_PASSWORD;
  const hosts = (env.FORKD_REGISTRY_HOSTS ?? "")
    .split(",")
    .map((h) => normalizeKey(h.trim()))
    .filter((h) => h.length > 0);
  const configPath = join(env.DOCKER_CONFIG ?? join(env.HOME ?? homedir(), ".docker"), "config.json");
  return async (host, o) => {
    const key = normalizeKey(host);
    const forAll = hosts.length === 0 && o?.namedOnly !== true;
    if (user && password !== undefined && (forAll || hosts.includes(key))) {
      return { username: user, password };
    }
    return fromDockerConfig(configPath, key);
  };
}

async function fromDockerConfig(path: string, key: string): Promise<Credentials | null> {
  let raw: string;
  try {
    raw = await readFile(path, "utf8");
  } catch {
    return null;
  }
  if (raw.length > MAX_CONFIG) return null;
  let auths: unknown;
  try {
    auths = (JSON.parse(raw) as { auths?: unknown }).auths;
  } catch {
    return null;
  }
  if (!auths || typeof auths !== "object") return null;
  for (const [k, v] of Object.entries(auths as Record<string, unknown>)) {
    if (normalizeKey(k) !== key || !v || typeof v !== "object") continue;
    const e = v as { auth?: unknown; username?: unknown; password?: unknown };
    if (typeof e.username === "string" && typeof e.password === "string") {
      return { username: e.username, password: e.password };
    }
    if (typeof e.auth === "string") {
      const plain = Buffer.from(e.auth, "base64").toString("utf8");
      const i = plain.indexOf(":");
      if (i > 0) return { username: plain.slice(0, i), password: plain.slice(i + 1) };
    }
  }
  return null;
}
