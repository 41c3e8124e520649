/**
 * `status`: each process of a local cluster, whether it runs (its recorded pid and start time)
 * and whether it serves (one probe, bounded), with the cluster's description (./describe.ts).
 */
import { resolve } from "node:path";
import { ForkdError } from "../util/index.js";
import { describe } from "./describe.js";
import type { ClusterInfo } from "./describe.js";
import { running } from "./launch.js";
import { readState } from "./state.js";
import { probe } from "./waits.js";

export interface ProcStatus {
  name: string;
  role: string;
  pid: number | null;
  running: boolean;
  /** null: it serves; else why not. */
  problem: string | null;
  log: string;
}

export interface ClusterStatus extends ClusterInfo {
  phase: string;
  processes: ProcStatus[];
}

export async function status(dirArg: string): Promise<ClusterStatus> {
  const dir = resolve(dirArg);
  const st = await readState(dir);
  if (!st) throw new ForkdError("not_found", `no local cluster is recorded in ${dir}`);
  const processes = await Promise.all(
    st.procs.map(async (p): Promise<ProcStatus> => {
      const alive = await running(p);
      return {
        name: p.name,
        role: p.role,
        pid: p.pid,
        running: alive,
        problem: alive ? await probe(p.probe, p.auth ? st.token : null) : "not running",
        log: p.log,
      };
    }),
  );
  return { ...describe(st), phase: st.phase, processes };
}
