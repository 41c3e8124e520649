/** A sandbox's files: directory listings, download links and uploads (streamed bytes, PUT). */
import { api, withQuery, withTicket } from "./http";
import type { DirList, FileWritten } from "./types";

const base = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}/files`;

export const list = (id: string, path: string) =>
  api<DirList>("GET", `${base(id)}/list`, undefined, { path });
/** The link shown (no credential in it); downloadNow() fetches it with a ticket. */
export const downloadUrl = (id: string, path: string) => withQuery(base(id), { path });

/** Starts the browser's download of a file: its URL with a fresh ticket, as a link clicked. */
export async function downloadNow(id: string, path: string, name: string): Promise<void> {
  const a = document.createElement("a");
  a.href = await withTicket(base(id), { path });
  a.download = name;
  a.rel = "noopener";
  document.body.append(a);
  a.click();
  a.remove();
}
export const upload = (id: string, path: string, file: Blob) =>
  api<FileWritten>("PUT", base(id), file, { path });

export function joinPath(dir: string, name: string): string {
  return dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
}

export function parentOf(path: string): string {
  const i = path.replace(/\/+$/, "").lastIndexOf("/");
  return i <= 0 ? "/" : path.slice(0, i);
}
