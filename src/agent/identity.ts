/**
 * Who the guest is: IDENTITY gives a forked child its own (fresh kernel RNG, the clock, hostname,
 * sandbox id, its pids limit, waiting for carrier), PING asks the agent for its own (protocol
 * version, uptime, whether the warm kernels are ready, which kernels the image has, which
 * optional behaviours the agent has).
 */
import { randomBytes } from "node:crypto";
import { Msg, Tag, intField, strField } from "./codec.js";
import type { AgentConnection } from "./connection.js";

export interface PingResult {
  version: number;
  uptimeMs: number;
  evalReady: boolean;
  /** The kernels the image has ("python", "javascript"); null: the agent predates kernels (python only). */
  kernels: string[] | null;
  /** Optional behaviours it has (`file-user`: file requests act as a named user); empty for older agents. */
  features: string[];
}

export interface Identity {
  hostname: string;
  sandboxId: string;
  /** Processes the guest workload may have (its cgroup's pids.max); absent: the guest default. */
  pidsMax?: number;
  /** The host set the NIC's link up: reply only once the guest has carrier (wait at most this long, ms). */
  netUpWaitMs?: number;
}

const KERNEL_RE = /^[a-z]{1,32}$/;
const FEATURE_RE = /^[a-z][a-z-]{0,31}$/;

/** A PING list: KERNELS ("python,javascript") or FEATURES (guest-sent: only well-formed names are kept). */
function nameList(s: string | undefined, re: RegExp): string[] | null {
  if (s === undefined) return null;
  return s === ""
    ? []
    : s
        .split(",")
        .filter((k) => re.test(k))
        .slice(0, 16);
}

export async function ping(conn: AgentConnection, timeoutMs = 5_000): Promise<PingResult> {
  const f = await conn.request(Msg.PING, [], timeoutMs);
  return {
    version: intField(f, Tag.VERSION) ?? 0,
    uptimeMs: intField(f, Tag.UPTIME_MS) ?? 0,
    evalReady: intField(f, Tag.EVAL_READY) === 1,
    kernels: nameList(strField(f, Tag.KERNELS), KERNEL_RE),
    features: nameList(strField(f, Tag.FEATURES), FEATURE_RE) ?? [],
  };
}

/** Gives a forked child its own identity: fresh kernel RNG, correct clock, hostname, id. */
export async function identity(conn: AgentConnection, id: Identity, timeoutMs = 10_000): Promise<void> {
  await conn.request(
    Msg.IDENTITY,
    [
      [Tag.SEED, randomBytes(64)],
      [Tag.TIME_NS, BigInt(Date.now()) * 1_000_000n],
      [Tag.HOSTNAME, id.hostname],
      [Tag.SANDBOX_ID, id.sandboxId],
      ...(id.pidsMax !== undefined ? ([[Tag.PIDS_MAX, BigInt(id.pidsMax)]] as const) : []),
      ...(id.netUpWaitMs ? [[Tag.NET_UP, BigInt(id.netUpWaitMs)] as const] : []),
    ],
    timeoutMs,
  );
}
