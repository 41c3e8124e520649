/**
 * What a tenant is told about the host: nothing of its file system. Error messages are written
 * for the operator (which file, where); for a tenant (a non-admin caller) every path under one of
 * the daemon's directories becomes a logical name: `<data>/…/disk.qcow2`. Every front door's
 * error replies go through here (the REST API's envelope and NDJSON: src/api/redact.ts; E2B's).
 */
/** The daemon's directories by logical name, e.g. {data: "/var/lib/forkd", cache: ...}. */
export type HostDirs = Record<string, string>;

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** Replaces each path under a directory of `dirs` (the longest first) in `text`. */
export function redactHostPaths(text: string, dirs: HostDirs): string {
  const roots = Object.entries(dirs)
    .filter(([, dir]) => dir.length > 1)
    .map(([name, dir]) => [name, dir.replace(/\/+$/, "")] as const)
    .sort((a, b) => b[1].length - a[1].length);
  let out = text;
  for (const [name, dir] of roots) {
    // The directory itself, or a path under it, up to a character paths in messages never hold.
    const re = new RegExp(`${escape(dir)}(?=$|[/\\s'"\`:,;)\\]])(/[^\\s'"\`:,;)\\]]*)?`, "g");
    out = out.replace(re, (_m, rest: string | undefined) => {
      const base = rest?.split("/").filter(Boolean).pop();
      return base ? `<${name}>/…/${base}` : `<${name}>`;
    });
  }
  return out;
}
