/**
 * The console's built front end (console/dist) under /console/: content types, caching
 * (`immutable` for the hashed assets/*, `no-store` for index.html), a strict CSP and the other
 * security headers. An unknown path under /console/ gives index.html (the front end routes by
 * hash); a path that would leave dist is 404; without a build, 503 saying how to make one.
 * /favicon.ico answers with the console's icon (an SVG), so a browser that asks finds one.
 * Transport-neutral: the reply is a status, headers and bytes, for the loopback console server
 * (node:http) and the daemon's TCP listener (Hono) alike.
 */
import { readFile, realpath, stat } from "node:fs/promises";
import { extname, isAbsolute, join, relative, resolve, sep } from "node:path";

export interface AssetReply {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

export const CSP =
  "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'";

/** Headers every console page and error carries. */
export const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy": CSP,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
};

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".map": "application/json",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".woff2": "font/woff2",
  ".woff": "font/woff",
  ".txt": "text/plain; charset=utf-8",
};

/** The console's icon (console/public/, copied into dist by the build), and the path it also answers. */
const ICON = "favicon.svg";
export const FAVICON_ICO = "/favicon.ico";

/** The biggest file served (the bundle is far smaller; anything bigger is not ours). */
const MAX_FILE = 32 << 20;

/** A small page (login refused, not found, no build) with the console's headers. */
export function page(status: number, text: string): AssetReply {
  const html = `<!doctype html><meta charset="utf-8"><title>forkd console</title><p>${escapeHtml(text)}</p>\n`;
  return {
    status,
    headers: { ...SECURITY_HEADERS, "content-type": "text/html; charset=utf-8", "cache-control": "no-store" },
    body: Buffer.from(html, "utf8"),
  };
}

const escapeHtml = (s: string): string => s.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);

/**
 * The file under `dist` that `relPath` (the part of the URL path after /console/, still
 * percent-encoded) names, or null when it would leave dist or cannot be a file name.
 */
export function resolveAsset(dist: string, relPath: string): string | null {
  let decoded: string;
  try {
    decoded = decodeURIComponent(relPath);
  } catch {
    return null;
  }
  if (decoded.includes("\0") || decoded.includes("\\") || isAbsolute(decoded)) return null;
  const root = resolve(dist);
  const full = resolve(root, decoded);
  const rel = relative(root, full);
  if (rel.startsWith("..") || isAbsolute(rel)) return null;
  return rel === "" ? root : join(root, rel);
}

/** Whether `p` (resolved through symlinks) is still inside `root`. */
async function inside(root: string, p: string): Promise<boolean> {
  const [r, real] = await Promise.all([realpath(root), realpath(p)]);
  return real === r || real.startsWith(r + sep);
}

async function fileReply(root: string, file: string, immutable: boolean): Promise<AssetReply | null> {
  try {
    const st = await stat(file);
    if (!st.isFile() || st.size > MAX_FILE || !(await inside(root, file))) return null;
    const body = await readFile(file);
    return {
      status: 200,
      headers: {
        ...SECURITY_HEADERS,
        "content-type": TYPES[extname(file).toLowerCase()] ?? "application/octet-stream",
        "cache-control": immutable ? "public, max-age=31536000, immutable" : "no-store",
      },
      body,
    };
  } catch {
    return null;
  }
}

/**
 * The reply for GET `urlPath` (a path under /console, or /favicon.ico). `/console` itself
 * redirects to `/console/`.
 */
export async function serveAsset(dist: string, urlPath: string): Promise<AssetReply> {
  // The icon where a browser asks for it unprompted (the page links /console/favicon.svg).
  if (urlPath === FAVICON_ICO)
    return (await fileReply(resolve(dist), join(resolve(dist), ICON), false)) ?? page(404, "not found");
  if (urlPath === "/console") {
    return { status: 308, headers: { ...SECURITY_HEADERS, location: "/console/" }, body: Buffer.alloc(0) };
  }
  if (!urlPath.startsWith("/console/")) return page(404, "not found");
  const root = resolve(dist);
  const index = join(root, "index.html");
  const haveIndex = await stat(index).then(
    (s) => s.isFile(),
    () => false,
  );
  if (!haveIndex) return page(503, "the console is not built: run scripts/install.sh");
  const rel = urlPath.slice("/console/".length);
  const file = resolveAsset(root, rel);
  if (file === null) return page(404, "not found");
  if (file !== root && file !== index) {
    const asset = await fileReply(root, file, relative(root, file).startsWith("assets" + sep));
    if (asset) return asset;
    // A missing hashed asset is a real 404 (a stale page); anything else is a front-end route.
    if (relative(root, file).startsWith("assets" + sep)) return page(404, "not found");
  }
  return (
    (await fileReply(root, index, false)) ?? page(503, "the console is not built: run scripts/install.sh")
  );
}

/** console/dist of this installation. */
export const consoleDist = (repoDir: string): string => join(repoDir, "console", "dist");
