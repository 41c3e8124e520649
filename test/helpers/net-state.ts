/**
 * What of a daemon's network instance (src/net/slots.ts) is in the kernel: its namespaces, its
 * host interfaces and its nft table, by name. Tests compare it before and after a daemon.
 */
import { execFile } from "node:child_process";
import { readdir } from "node:fs/promises";
import { promisify } from "node:util";
import { NETNS_DIR } from "../../src/net/slots.js";

const run = promisify(execFile);

/** Names ("netns …", "link …", "table …") of instance `id` present now. */
export async function instanceState(id: string): Promise<string[]> {
  const out: string[] = [];
  for (const n of await readdir(NETNS_DIR).catch(() => [] as string[]))
    if (n.startsWith(`forkd-${id}-`)) out.push(`netns ${n}`);
  for (const l of await readdir("/sys/class/net").catch(() => [] as string[]))
    if (l.startsWith(`fk${id}h`)) out.push(`link ${l}`);
  const tables = await run("nft", ["list", "tables"], { timeout: 15_000 }).then(
    (r) => r.stdout,
    () => "",
  );
  if (new RegExp(`^table inet forkd_${id}$`, "m").test(tables)) out.push(`table inet forkd_${id}`);
  return out.sort();
}
