/**
 * A child whose VMM runs in a netns slot (../pool.ts): with a tap (mode netns) or with slirp
 * (user mode with a way out, so slirp's sockets meet the host's rules). It holds the slot, whose
 * host rules carry its egress, and a relay (../expose.ts) per exposed port from the expose
 * address to the slot's. Released, the slot goes back to the pool to be recycled.
 */
import { ForkdError } from "../../util/index.js";
import type { NetBackend } from "../backend.js";
import { PortRelay } from "../expose.js";
import type { Egress, NetworkSpec } from "../policy.js";
import type { SlotPool, SlotUse } from "../pool.js";
import type { Slot } from "../slots.js";
import type { Attachment, HostForwarder, NetworkRecord } from "./attachment.js";
import { serial } from "./serial.js";

/** What a slotted attachment asks of the slot pool. */
export type SlotLeases = Pick<SlotPool, "acquire" | "adopt" | "release" | "setNs" | "setPolicy">;

/** What slotted attachments share: the pool, where relays listen, and every relay running. */
export interface SlotHost {
  readonly pool: SlotLeases;
  /** The host address exposed ports are relayed from (FORKD_EXPOSE_ADDR). */
  readonly exposeAddr: string;
  /** Where a slot's DNS goes (the host's resolver). */
  readonly resolver: string | null;
  /** Every relay of every attachment (closed at daemon shutdown). */
  readonly relays: Set<PortRelay>;
}

/**
 * A slot namespace's table for a child. slirp without exposed ports needs nothing of it (its
 * sockets are the namespace's own), so it gets the free slot's table and taking the slot
 * changes nothing there.
 */
export function nsUse(host: SlotHost, tap: boolean, expose: number[]): SlotUse["ns"] {
  const backend = tap || expose.length === 0 ? "tap" : "user";
  return { backend, dnsTo: host.resolver, expose };
}

export class SlottedAttachment implements Attachment {
  readonly linkUp = true;
  readonly netns: string;
  private readonly relays = new Map<number, PortRelay>();
  private readonly ports: Record<string, string> = {};
  private exposed: number[];
  private egress: Egress;
  private readonly tap: boolean;
  private readonly one = serial();
  private released = false;

  private constructor(
    private readonly host: SlotHost,
    private readonly slot: Slot,
    readonly backend: NetBackend,
    readonly binary: string | undefined,
    private readonly spec: NetworkSpec,
    private readonly guestIp: string | null,
    /** The record before a pause (or a daemon restart): relays come back on the same ports. */
    private readonly prior: NetworkRecord | undefined,
  ) {
    this.netns = slot.netnsPath;
    this.exposed = [...spec.expose];
    this.egress = spec.egress;
    this.tap = spec.mode === "netns";
  }

  /** A child about to start: takes a slot with its policy (`binary`: slirp's QEMU, not a tap's). */
  static async acquire(
    host: SlotHost,
    spec: NetworkSpec,
    guestIp: string,
    binary: string | undefined,
    prior: NetworkRecord | undefined,
  ): Promise<SlottedAttachment> {
    const tap = spec.mode === "netns";
    const slot = await host.pool.acquire({ egress: spec.egress, ns: nsUse(host, tap, spec.expose) });
    const backend: NetBackend = tap
      ? { kind: "tap", ifname: slot.tapIf }
      : {
          kind: "user",
          restrict: false,
          forwards: spec.expose.map((p) => ({ hostAddr: slot.nsAddr, hostPort: p, guestPort: p })),
        };
    return new SlottedAttachment(host, slot, backend, tap ? undefined : binary, spec, guestIp, prior);
  }

  /** A running child found after a daemon restart: its slot is marked busy again (before reclaim). */
  static adopt(host: SlotHost, slot: Slot, r: NetworkRecord): SlottedAttachment {
    const spec: NetworkSpec = { mode: r.mode, egress: r.egress, expose: r.expose };
    host.pool.adopt(slot.index, { egress: r.egress, ns: nsUse(host, r.mode === "netns", r.expose) });
    return new SlottedAttachment(host, slot, { kind: "none" }, undefined, spec, r.guestIp, r);
  }

  async start(): Promise<void> {
    for (const p of this.exposed) await this.relay(p);
  }

  record(): NetworkRecord {
    return {
      ...this.spec,
      egress: this.egress,
      expose: [...this.exposed],
      guestIp: this.guestIp,
      slot: this.released ? null : this.slot.index,
      ports: { ...this.ports },
    };
  }

  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    await Promise.all([...this.relays.values()].map((r) => r.close()));
    for (const r of this.relays.values()) this.host.relays.delete(r);
    this.host.pool.release(this.slot.index);
  }

  expose(port: number, vmm: HostForwarder): Promise<void> {
    return this.one(async () => {
      if (this.exposed.includes(port)) return;
      this.checkHeld();
      const next = [...this.exposed, port];
      // slirp in the slot listens at the slot's address; a tap's guest is DNATed to there.
      if (!this.tap) await vmm.hostfwdAdd(`tcp:${this.slot.nsAddr}:${port}-${this.guestIp ?? ""}:${port}`);
      await this.host.pool.setNs(this.slot.index, nsUse(this.host, this.tap, next));
      await this.relay(port);
      this.exposed.push(port);
    });
  }

  unexpose(port: number, vmm: HostForwarder): Promise<void> {
    return this.one(async () => {
      if (!this.exposed.includes(port)) return;
      this.checkHeld();
      const next = this.exposed.filter((p) => p !== port);
      const r = this.relays.get(port);
      await r?.close();
      if (r) this.host.relays.delete(r);
      this.relays.delete(port);
      delete this.ports[String(port)];
      this.exposed = next;
      await this.host.pool.setNs(this.slot.index, nsUse(this.host, this.tap, next));
      if (!this.tap) await vmm.hostfwdRemove(`tcp:${this.slot.nsAddr}:${port}`);
    });
  }

  setEgress(next: Egress): Promise<void> {
    return this.one(async () => {
      this.checkHeld();
      await this.host.pool.setPolicy(this.slot.index, next);
      this.egress = next;
    });
  }

  private checkHeld(): void {
    if (this.released) throw new ForkdError("conflict", "the sandbox's network is gone");
  }

  /** Relays guest port `p` from the expose address (the port it had before, if still free). */
  private async relay(p: number): Promise<void> {
    const want = Number(this.prior?.ports[String(p)]?.split(":")[1] ?? 0);
    const r = await PortRelay.listen(this.host.exposeAddr, want, { host: this.slot.nsAddr, port: p });
    this.relays.set(p, r);
    this.host.relays.add(r);
    this.ports[String(p)] = `${r.hostAddr}:${r.hostPort}`;
  }
}
