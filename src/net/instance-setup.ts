/**
 * Readies this daemon's slot instance on the host at start (docs/architecture.md, "Recycling
 * and recovery"): removes orphaned instances, refuses a slot block that overlaps a route of the
 * host's, records the instance's owner, turns IPv4 forwarding on, and makes the slot pool.
 */
import { writeFile } from "node:fs/promises";
import { ForkdError, errorMessage } from "../util/index.js";
import { GUEST_NET } from "./guest.js";
import { orphanInstances, recordOwner } from "./owners.js";
import { cidrContains, parseCidr } from "./policy.js";
import type { AllowRule } from "./policy.js";
import { SlotPool, teardownInstance } from "./pool.js";
import type { Logger } from "../util/index.js";
import { blockText, hostIfPrefix, instanceId, instanceOf } from "./slots.js";
import type { NetInstance } from "./slots.js";
import { hostRoutes, sysctl } from "./sys.js";

export interface InstanceSetupOptions {
  dataDir: string;
  env: NodeJS.ProcessEnv;
  log: Logger;
  /** Where the host's DNS resolver is (a slot's DNS goes there). */
  resolver: string | null;
  /** Host TCP ports no sandbox may reach (the daemon's API). */
  protectedPorts: number[];
  /** Host destinations the operator opened to sandboxes (FORKD_NET_HOST_ALLOW). */
  hostOpen: AllowRule[];
  /** Slots made ahead, and at most. */
  warm: number;
  max: number;
  /** Where instances' owner markers live (./owners.ts; tests). */
  ownersDir?: string;
}

/** This daemon's instance and its pool; throws what makes netns mode unavailable here. */
export async function setUpInstance(o: InstanceSetupOptions): Promise<{ inst: NetInstance; pool: SlotPool }> {
  const inst = instanceOf(instanceId(o.dataDir, o.env), o.max, o.env);
  // Orphans' slot routes would also push this block aside: they go first.
  await removeOrphans(inst.id, o.log, o.ownersDir);
  await checkBlockFree(inst);
  await recordOwner(inst.id, o.dataDir, o.ownersDir).catch((e: unknown) =>
    o.log.warn("network: cannot record the instance's owner", { error: errorMessage(e) }),
  );
  // Slots route through the host: forwarding on (as any container runtime does).
  if ((await sysctl("net.ipv4.ip_forward")) !== "1") {
    await writeFile("/proc/sys/net/ipv4/ip_forward", "1\n");
    o.log.info("network: enabled net.ipv4.ip_forward for netns slots");
  }
  const pool = new SlotPool({
    inst,
    guest: GUEST_NET,
    resolver: o.resolver,
    protectedPorts: o.protectedPorts,
    hostOpen: o.hostOpen,
    warm: Math.min(o.warm, o.max),
    log: o.log,
  });
  return { inst, pool };
}

/** Removes the instances whose data directory is gone and held by no daemon (./owners.ts). */
async function removeOrphans(ownId: string, log: Logger, dir?: string): Promise<void> {
  try {
    for (const o of await orphanInstances(ownId, dir)) {
      log.info("network: removing the slots of a data directory that no longer exists", {
        instance: o.id,
        data_dir: o.dataDir,
      });
      await teardownInstance(instanceOf(o.id, 1, {}), dir);
    }
  } catch (e) {
    log.warn("network: could not look for orphaned instances", { error: errorMessage(e) });
  }
}

/** Refuses a slot block that overlaps a route of the host's that is not one of ours. */
async function checkBlockFree(inst: NetInstance): Promise<void> {
  const block = parseCidr(blockText(inst));
  for (const r of await hostRoutes()) {
    if (r.dev.startsWith(hostIfPrefix(inst))) continue;
    let c;
    try {
      c = parseCidr(r.dst.includes("/") ? r.dst : `${r.dst}/32`, "route");
    } catch {
      continue;
    }
    const overlap = cidrContains(block, c.addr) || cidrContains(c, block.addr);
    if (overlap) {
      throw new ForkdError(
        "unavailable",
        `the slot block ${blockText(inst)} overlaps the host's route ${r.dst} (dev ${r.dev}); set FORKD_NET_SUBNET`,
      );
    }
  }
}
