/** Calls tests make against a daemon with real VMs: checked requests, one child, a shell command. */
import assert from "node:assert/strict";
import { checkedRequest } from "./contract.js";
import type { TestDaemon } from "./daemon.js";

export const api = <T>(d: TestDaemon, method: string, path: string, body?: unknown) =>
  checkedRequest<T>(d.ep, method, path, body, 1_800_000);

/** Forks one child of `tag`; its id. */
export async function forkOne(d: TestDaemon, tag: string): Promise<string> {
  const r = await api<{ sandboxes: { id: string }[] }>(d, "POST", "/v1/sandboxes", {
    snapshot_tag: tag,
    n: 1,
  });
  const id = r.sandboxes[0]?.id;
  assert.ok(id);
  return id;
}

/** Runs `cmd` in the child; its stdout. */
export const sh = async (d: TestDaemon, id: string, cmd: string): Promise<string> =>
  (await api<{ stdout: string }>(d, "POST", `/v1/sandboxes/${id}/exec`, { cmd })).stdout;
