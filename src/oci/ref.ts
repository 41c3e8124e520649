/**
 * Image references as people write them: `python:3.11`, `user/app`, `ghcr.io/o/x:tag`,
 * `127.0.0.1:5000/x@sha256:…`. The registry host is implied the way Docker implies it: a first
 * component with no `.` or `:` that is not `localhost` is a Docker Hub repository
 * (`docker.io/…`, `library/` for one-component names); the strict parser (src/registry/ref.ts)
 * does the rest.
 */
import { parseRef } from "../registry/index.js";
import type { RegistryRef } from "../registry/index.js";

export interface ImageRef extends RegistryRef {
  /** Normalized: `docker.io/library/python:3.11`, `127.0.0.1:5000/x:y`, `…@sha256:…`. */
  normalized: string;
}

/** Whether `first` (the text before the first `/`) names a registry host. */
const namesHost = (first: string): boolean =>
  first.includes(".") || first.includes(":") || first === "localhost" || first.startsWith("[");

export function parseImageRef(ref: string): ImageRef {
  const slash = typeof ref === "string" ? ref.indexOf("/") : -1;
  const first = slash < 0 ? "" : ref.slice(0, slash);
  const full = slash < 0 || !namesHost(first) ? `docker.io/${String(ref)}` : ref;
  const r = parseRef(full);
  const host = r.hostname === "index.docker.io" ? "docker.io" : r.host;
  const normalized = `${host}/${r.name}${r.tag ? `:${r.tag}` : ""}${r.digest ? `@${r.digest}` : ""}`;
  return { ...r, host, normalized };
}
