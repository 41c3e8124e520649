/**
 * Network slots: the names and addresses of each, derived from its index, in one place.
 *
 * A daemon instance (one data directory) has an id of 4 hex digits that is part of every name it
 * gives the kernel, so two daemons on one host never touch each other's, and one that restarts
 * finds its own leftovers. Slot i of instance X:
 *
 *   network namespace  forkd-X-i            (/run/netns/forkd-X-i, from `ip netns add`)
 *   host veth          fkXhi                (address: base + 4i + 1 /30)
 *   its peer, in ns    veth0                (address: base + 4i + 2 /30; default route via the host end)
 *   tap in ns          tap0                 (the guest's gateway: 10.0.2.2/24 and 10.0.2.3, slirp's MAC)
 *   host nft chains    inet forkd_X: sI (egress), hI (to the host itself)
 *
 * `base` is a /22 (256 slots) or larger block (FORKD_NET_SUBNET, default derived from the id).
 */
import { createHash } from "node:crypto";
import { ForkdError } from "../util/index.js";
import { intToIp, prefixMask } from "./guest.js";
import { parseCidr } from "./policy.js";

export interface NetInstance {
  /** 4 lowercase hex digits. */
  id: string;
  /** The block slot addresses come from. */
  base: number;
  prefix: number;
  /** Slots this instance may have (bounded by the block: one /30 each). */
  maxSlots: number;
}

export interface Slot {
  index: number;
  netns: string;
  netnsPath: string;
  hostIf: string;
  nsIf: string;
  tapIf: string;
  hostAddr: string;
  nsAddr: string;
}

export const NETNS_DIR = "/run/netns";
export const NS_IF = "veth0";
export const TAP_IF = "tap0";

const ID_RE = /^[0-9a-f]{4}$/;

/** The instance id of a data directory (FORKD_NET_ID overrides). */
export function instanceId(dataDir: string, env: NodeJS.ProcessEnv = process.env): string {
  const id = env.FORKD_NET_ID ?? createHash("sha256").update(dataDir).digest("hex").slice(0, 4);
  if (!ID_RE.test(id))
    throw new ForkdError("invalid_argument", `FORKD_NET_ID must be 4 hex digits (got ${id})`);
  return id;
}

/**
 * The block slots are numbered from: FORKD_NET_SUBNET (a /22 or larger), else a /22 in
 * 10.200.0.0/13 chosen by the id (so two daemons rarely collide; the daemon checks the host's
 * routes before using it).
 */
export function instanceOf(id: string, maxSlots: number, env: NodeJS.ProcessEnv = process.env): NetInstance {
  let base: number;
  let prefix: number;
  if (env.FORKD_NET_SUBNET) {
    const c = parseCidr(env.FORKD_NET_SUBNET, "FORKD_NET_SUBNET");
    if (c.prefix > 28) throw new ForkdError("invalid_argument", "FORKD_NET_SUBNET must be a /28 or larger");
    base = c.addr;
    prefix = c.prefix;
  } else {
    const h = parseInt(id, 16);
    base = (((10 << 24) | ((200 + ((h >> 6) & 7)) << 16) | ((h & 63) << 10)) >>> 0) & prefixMask(22);
    prefix = 22;
  }
  const capacity = 2 ** (32 - prefix) / 4;
  if (maxSlots > capacity) {
    throw new ForkdError(
      "invalid_argument",
      `${maxSlots} network slots need a /${32 - Math.ceil(Math.log2(maxSlots * 4))}; ${intToIp(base)}/${prefix} holds ${capacity}`,
    );
  }
  return { id, base, prefix, maxSlots };
}

export function slotOf(inst: NetInstance, index: number): Slot {
  if (!Number.isInteger(index) || index < 0 || index >= inst.maxSlots) {
    throw new ForkdError("internal", `slot ${index} out of range`);
  }
  const netns = `forkd-${inst.id}-${index}`;
  return {
    index,
    netns,
    netnsPath: `${NETNS_DIR}/${netns}`,
    hostIf: `${hostIfPrefix(inst)}${index}`,
    nsIf: NS_IF,
    tapIf: TAP_IF,
    hostAddr: intToIp(inst.base + 4 * index + 1),
    nsAddr: intToIp(inst.base + 4 * index + 2),
  };
}

export const hostIfPrefix = (inst: NetInstance): string => `fk${inst.id}h`;
export const tableName = (inst: NetInstance): string => `forkd_${inst.id}`;
export const blockText = (inst: NetInstance): string => `${intToIp(inst.base)}/${inst.prefix}`;

/** The slot index of a namespace name of this instance, or null. */
export function slotIndexOfNetns(inst: NetInstance, name: string): number | null {
  const m = new RegExp(`^forkd-${inst.id}-(\\d{1,5})$`).exec(name);
  return m ? Number(m[1]) : null;
}
