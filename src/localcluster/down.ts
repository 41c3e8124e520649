/**
 * `down`: removes a local cluster, exactly what its record says `up` made, whatever state it is
 * in (up, half made by a `up` that died, already partly removed): stops its gateways, nodes and
 * etcd members (SIGTERM, SIGKILL after a bound), kills whatever else of it runs (a node's VMMs
 * and helpers: ./sweep.ts), removes its namespaces, links, nft table and forkd network instances
 * (./host-net.ts), checks none is left, and deletes its directory. Idempotent: a directory with
 * no cluster is left as it is (an empty one is removed).
 */
import { readdir, rm, rmdir } from "node:fs/promises";
import { resolve } from "node:path";
import { ForkdError, errorMessage } from "../util/index.js";
import { stillMade, unmake } from "./host-net.js";
import { stop } from "./launch.js";
import { readState } from "./state.js";
import { killClusterProcesses } from "./sweep.js";

export interface DownResult {
  /** Whether a cluster was recorded there. */
  found: boolean;
  id: string | null;
}

export async function down(
  dirArg: string,
  o: { graceMs?: number; say?: (line: string) => void } = {},
): Promise<DownResult> {
  const dir = resolve(dirArg);
  const say = o.say ?? (() => undefined);
  const st = await readState(dir);
  if (!st) {
    const entries = await readdir(dir).catch(() => null);
    if (entries !== null && entries.length === 0) await rmdir(dir);
    return { found: false, id: null };
  }
  const problems: string[] = [];
  // Front to back: gateways, then nodes, then etcd (nodes may still write to it while stopping).
  for (const role of ["gateway", "node", "etcd"] as const) {
    const ps = st.procs.filter((p) => p.role === role);
    // An etcd member stopping tries to hand its leadership over to peers that are stopping too:
    // its data is removed below, so it is given less time.
    const grace = role === "etcd" ? 2_000 : (o.graceMs ?? 10_000);
    const r = await Promise.allSettled(ps.map((p) => stop(p, "SIGTERM", grace)));
    for (const x of r) if (x.status === "rejected") problems.push(errorMessage(x.reason));
  }
  const left = await killClusterProcesses(st);
  if (left.length > 0) problems.push(`processes that would not die: ${left.join(", ")}`);
  // Reverse order of making: node network instances, member namespaces, the NAT table, the root
  // link, the hub.
  for (const m of [...st.made].reverse()) {
    await unmake(m).catch((e: unknown) => problems.push(errorMessage(e)));
  }
  const remaining = await stillMade(st.made);
  if (remaining.length > 0) problems.push(`still in the kernel: ${remaining.join(", ")}`);
  if (problems.length > 0)
    throw new ForkdError(
      "internal",
      `cluster ${st.id} not fully removed (its record stays in ${dir}; run down again):\n${problems.join("\n")}`,
    );
  await rm(dir, { recursive: true, force: true });
  say(`cluster ${st.id} removed`);
  return { found: true, id: st.id };
}
