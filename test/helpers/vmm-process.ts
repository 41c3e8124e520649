/** A VMM process as the host sees it, for tests of its jail: its status, its QEMU, a command run as its uid. */
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { promisify } from "node:util";
import { pidsReferencing, processCmdline } from "../../src/util/proc.js";

const run = promisify(execFile);

/** /proc/PID/status as fields (Uid, CapEff, NoNewPrivs, Seccomp, ...). */
export async function procStatus(pid: number): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const line of (await readFile(`/proc/${pid}/status`, "utf8")).split("\n")) {
    const i = line.indexOf(":");
    if (i > 0) out[line.slice(0, i)] = line.slice(i + 1).trim();
  }
  return out;
}

export const uidOf = (st: Record<string, string>): string => st.Uid!.split(/\s+/)[0]!;
export const gidOf = (st: Record<string, string>): string => st.Gid!.split(/\s+/)[0]!;

/** The pid of the QEMU whose command line names `fragment`, or null. */
export async function qemuNaming(fragment: string): Promise<number | null> {
  for (const pid of await pidsReferencing(fragment))
    if ((await processCmdline(pid))[0]?.includes("qemu-system")) return pid;
  return null;
}

/** Runs `argv` as `uid` (jail gid, no groups), optionally inside `nsOf`'s mount namespace. */
export async function asVmm(
  uid: string,
  gid: string,
  argv: string[],
  nsOf?: number,
): Promise<{ ok: boolean; out: string }> {
  const pre = nsOf ? ["nsenter", "-t", String(nsOf), "-m", "--"] : [];
  const cmd = [...pre, "setpriv", `--reuid=${uid}`, `--regid=${gid}`, "--clear-groups", "--", ...argv];
  return run(cmd[0]!, cmd.slice(1)).then(
    (r) => ({ ok: true, out: r.stdout + r.stderr }),
    (e: { stderr?: string }) => ({ ok: false, out: e.stderr ?? "" }),
  );
}
