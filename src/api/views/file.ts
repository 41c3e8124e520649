/** Files in a guest as the API serves them: the agent's stat (agent/client.ts) as wire views. */
import type { z } from "zod";
import type { DirEntry, FileStat as AgentStat } from "../../agent/index.js";
import type { DirList, FileStat } from "../contract/schemas.js";

export type FileStatView = z.infer<typeof FileStat>;
export type DirListView = z.infer<typeof DirList>;

const statFields = (st: AgentStat) => ({ type: st.type, size: st.size, mode: st.mode, mtime_ms: st.mtimeMs });

export const fileStatView = (path: string, st: AgentStat): FileStatView => ({ path, ...statFields(st) });

export const dirListView = (path: string, entries: DirEntry[]): DirListView => ({
  path,
  entries: entries.map((e) => ({ name: e.name, ...statFields(e) })),
});
