/** The sandbox actions the console offers: fork, kill, pause, resume, branch, set the idle timeout, the running commands and the ended ones. */
import { api, request } from "./http";
import type { BranchResult, CommandHistory, CommandList, ForkResult } from "./types";

const base = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}`;

export const fork = (snapshot_tag: string, n: number) =>
  api<ForkResult>("POST", "/v1/sandboxes", { snapshot_tag, n });
export const kill = async (id: string) => void (await request("DELETE", base(id)));
export const pause = async (id: string) => void (await request("POST", `${base(id)}/pause`, {}));
export const resume = async (id: string) => void (await request("POST", `${base(id)}/resume`, {}));
export const branch = (id: string, tag?: string) =>
  api<BranchResult>("POST", `${base(id)}/branch`, tag ? { tag } : {});
export const setTimeoutMs = async (id: string, timeout_ms: number | null) =>
  void (await request("POST", `${base(id)}/timeout`, { timeout_ms }));
export const commands = (id: string) => api<CommandList>("GET", `${base(id)}/commands`);
export const commandHistory = (id: string) => api<CommandHistory>("GET", `${base(id)}/commands/history`);
