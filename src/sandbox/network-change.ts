/**
 * Changing a running sandbox's network: exposing and unexposing guest ports, replacing its
 * egress policy. Each change is written to its record: kept across pause, resume and a daemon
 * restart.
 */
import { MAX_EXPOSE } from "../net/index.js";
import type { Egress } from "../net/index.js";
import type { Attachment, NetworkRecord } from "../net/index.js";
import { ForkdError } from "../util/index.js";
import type { Vm } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";
import { saveRecord } from "./record.js";
import type { Sandbox } from "./sandbox.js";
import { notInTransition } from "./transition.js";

/**
 * Exposes guest TCP port `port` of a running sandbox on the host (already exposed: nothing
 * changes); its network's ports say where it answers.
 */
export function exposePort(ctx: SandboxContext, id: string, port: number): Promise<Sandbox> {
  return changeNetwork(ctx, id, "port", "ports are exposed", async (net, rec, vm) => {
    if (rec.expose.includes(port)) return false;
    if (rec.expose.length >= MAX_EXPOSE)
      throw new ForkdError("resource_exhausted", `sandbox ${id} exposes ${MAX_EXPOSE} ports already`, {
        limit: MAX_EXPOSE,
      });
    await net.expose(port, vm);
    return true;
  });
}

/** Stops exposing guest TCP port `port` of a running sandbox (not exposed: nothing changes). */
export function unexposePort(ctx: SandboxContext, id: string, port: number): Promise<Sandbox> {
  return changeNetwork(ctx, id, "port", "ports are exposed", async (net, rec, vm) => {
    if (!rec.expose.includes(port)) return false;
    await net.unexpose(port, vm);
    return true;
  });
}

/**
 * Replaces a running sandbox's egress policy (mode netns, or user with egress allow or list):
 * the host's rules change in one transaction, and flows the old policy allowed are re-checked.
 */
export function setEgress(ctx: SandboxContext, id: string, egress: Egress): Promise<Sandbox> {
  return changeNetwork(ctx, id, "egress", "an egress policy is set", async (net) => {
    await net.setEgress(egress);
    return true;
  });
}

/**
 * Changes the network of a running sandbox (not while it is being paused, resumed or branched)
 * with `change`, which says whether it changed anything; the record is then written again.
 */
async function changeNetwork(
  ctx: SandboxContext,
  id: string,
  field: string,
  what: string,
  change: (net: Attachment, rec: NetworkRecord, vm: Vm) => Promise<boolean>,
): Promise<Sandbox> {
  const s = ctx.live.running(id);
  notInTransition(s);
  const net = s.net;
  const rec = s.record.network;
  if (!net || !rec || rec.mode === "none")
    throw new ForkdError(
      "invalid_argument",
      `sandbox ${id} has no network: ${what} on sandboxes created with network mode user or netns`,
      { id, field },
    );
  if (await change(net, rec, s.vm)) {
    s.record = { ...s.record, network: net.record() };
    await saveRecord(s.dir, s.record);
  }
  return s;
}
