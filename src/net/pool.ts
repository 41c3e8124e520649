/**
 * The pool of network slots (./slots.ts): a few created ahead, more on demand up to the
 * instance's maximum; each is given to one VMM at a time with that sandbox's policy, and
 * recycled when it exits (rules back to "nothing allowed", connection tracking forgotten).
 *
 * After a daemon crash, reclaim() takes the kernel state back: slots still used by children the
 * new daemon re-adopted keep their rules (rewritten atomically, never absent); every other
 * namespace and interface of this instance is deleted and slots are created afresh.
 */
import { ForkdError, errorMessage } from "../util/index.js";
import type { Logger } from "../util/index.js";
import type { GuestNet } from "./guest.js";
import { hostTable, nsTable, slotPolicy } from "./nft.js";
import type { NsTableOptions, RuleContext } from "./nft.js";
import { forgetOwner, OWNERS_DIR } from "./owners.js";
import type { AllowRule, Egress } from "./policy.js";
import type { NetInstance, Slot } from "./slots.js";
import { hostIfPrefix, slotIndexOfNetns, slotOf, tableName } from "./slots.js";
import { conntrackFlush, inNetns, ip, ipBatch, listLinks, listNetns, nft } from "./sys.js";

export interface SlotUse {
  egress: Egress;
  ns: NsTableOptions;
}

export interface SlotPoolOptions {
  inst: NetInstance;
  guest: GuestNet;
  resolver: string | null;
  /** Host TCP ports no slot may reach (the daemon's API). */
  protectedPorts: number[];
  /** Host destinations the operator opened to sandboxes (FORKD_NET_HOST_ALLOW). */
  hostOpen: AllowRule[];
  /** Free slots kept ready. */
  warm: number;
  log: Logger;
}

/** Whether two uses give a slot's namespace the same table. */
const sameNs = (a: NsTableOptions, b: NsTableOptions): boolean =>
  a.backend === b.backend && a.dnsTo === b.dnsTo && a.expose.join() === b.expose.join();

/** Forgets the host's connection tracking of a slot's flows: their next packets meet the policy. */
async function forgetHostFlows(s: Slot): Promise<void> {
  await conntrackFlush(["-D", "-s", s.nsAddr]);
  await conntrackFlush(["-D", "-d", s.nsAddr]);
}

export class SlotPool {
  private readonly free: number[] = [];
  private readonly busy = new Map<number, SlotUse>();
  /** Slots that exist in the kernel (free, busy, or being recycled). */
  private readonly created = new Set<number>();
  private creating = 0;
  private closed = false;
  /** Host-table changes one at a time (concurrent nft transactions can fail each other). */
  private hostQueue: Promise<unknown> = Promise.resolve();

  /**
   * A free slot's namespace table, which is also a netns child's without exposed ports (applying
   * nothing at acquire then): a tap with no VMM on it forwards nothing, and DNS is DNATed to the
   * resolver whatever the policy (the host's rules decide whether it passes).
   */
  private readonly idle: NsTableOptions;
  /** What every slot's rules depend on besides its policy. */
  private readonly rules: RuleContext;

  constructor(private readonly o: SlotPoolOptions) {
    this.idle = { backend: "tap", dnsTo: o.resolver, expose: [] };
    this.rules = { resolver: o.resolver, hostOpen: o.hostOpen.length > 0 };
  }

  private host(script: string): Promise<unknown> {
    const next = this.hostQueue.then(() => nft(script));
    this.hostQueue = next.catch(() => undefined);
    return next;
  }

  /** Before reclaim(): a slot a re-adopted running child holds. */
  adopt(index: number, use: SlotUse): void {
    this.busy.set(index, use);
    this.created.add(index);
  }

  status(): { free: number; busy: number; max: number } {
    return { free: this.free.length, busy: this.busy.size, max: this.o.inst.maxSlots };
  }

  /** Takes the kernel state back after a start (see the header), then fills the pool. */
  async reclaim(): Promise<void> {
    const { inst } = this.o;
    const policies = new Map([...this.busy].map(([i, u]) => [i, u.egress]));
    await this.host(hostTable(inst, { ...this.o, policies }));
    for (const name of await listNetns()) {
      const index = slotIndexOfNetns(inst, name);
      if (index === null) continue;
      const use = index < inst.maxSlots ? this.busy.get(index) : undefined;
      if (use) {
        await nft(nsTable(this.o.guest, slotOf(inst, index), use.ns), name);
        continue;
      }
      this.o.log.info("network: removing a slot left by an earlier daemon", { netns: name });
      await ip(["netns", "del", name]).catch(() => undefined);
    }
    // Host ends whose namespace is gone (a half-made slot) go too.
    for (const link of await listLinks()) {
      if (!link.startsWith(hostIfPrefix(inst))) continue;
      const index = Number(link.slice(hostIfPrefix(inst).length));
      if (!this.busy.has(index)) await ip(["link", "del", link]).catch(() => undefined);
    }
    this.fill();
  }

  /** Creates free slots in the background until `warm` are ready. */
  private fill(): void {
    const want = Math.min(this.o.warm, this.o.inst.maxSlots);
    while (!this.closed && this.free.length + this.creating < want && this.nextIndex() !== null) {
      const index = this.nextIndex() as number;
      this.creating++;
      this.created.add(index);
      void this.create(index)
        .then(() => this.free.push(index))
        .catch((e: unknown) => {
          this.created.delete(index);
          this.o.log.warn("network: could not create a slot", { index, error: errorMessage(e) });
        })
        .finally(() => this.creating--);
    }
  }

  private nextIndex(): number | null {
    for (let i = 0; i < this.o.inst.maxSlots; i++) if (!this.created.has(i)) return i;
    return null;
  }

  /** Makes slot `index` in the kernel, with no rules allowing anything yet. */
  private async create(index: number): Promise<void> {
    const s = slotOf(this.o.inst, index);
    const g = this.o.guest;
    await ip(["netns", "del", s.netns]).catch(() => undefined);
    await ip(["link", "del", s.hostIf]).catch(() => undefined);
    await ip(["netns", "add", s.netns]);
    try {
      // Before any interface exists: no IPv6 anywhere in the slot, and it routes. Any port may
      // be bound in it by its (unprivileged, jailed) VMM: slirp's forward of an exposed guest
      // port below 1024 listens on the same port at the slot's address.
      await inNetns(s.netns, "sysctl", [
        "-q",
        "-w",
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
        "net.ipv4.ip_forward=1",
        "net.ipv4.ip_unprivileged_port_start=0",
      ]);
      await nft(nsTable(g, s, this.idle), s.netns);
      await ipBatch([
        `link add ${s.hostIf} type veth peer name ${s.nsIf} netns ${s.netns}`,
        `addr add ${s.hostAddr}/30 dev ${s.hostIf}`,
        `link set ${s.hostIf} up`,
      ]);
      await ipBatch(
        [
          `link set lo up`,
          `addr add ${s.nsAddr}/30 dev ${s.nsIf}`,
          `link set ${s.nsIf} up`,
          `route add default via ${s.hostAddr}`,
          `tuntap add dev ${s.tapIf} mode tap`,
          `link set ${s.tapIf} address ${g.gatewayMac}`,
          `addr add ${g.gateway}/${g.prefix} dev ${s.tapIf}`,
          `addr add ${g.dns}/32 dev ${s.tapIf}`,
          `link set ${s.tapIf} up`,
        ],
        s.netns,
      );
    } catch (e) {
      await ip(["netns", "del", s.netns]).catch(() => undefined);
      await ip(["link", "del", s.hostIf]).catch(() => undefined);
      throw e;
    }
  }

  /** A slot set up for `use`: a ready one, or one made now (slower) if none is. */
  async acquire(use: SlotUse): Promise<Slot> {
    if (this.closed) throw new ForkdError("unavailable", "network slots are shutting down");
    let index = this.free.shift();
    if (index === undefined) {
      const next = this.nextIndex();
      if (next === null) {
        throw new ForkdError(
          "resource_exhausted",
          `all ${this.o.inst.maxSlots} network slots are in use (FORKD_NET_MAX_SLOTS)`,
          { limit: this.o.inst.maxSlots },
        );
      }
      this.created.add(next);
      try {
        await this.create(next);
      } catch (e) {
        this.created.delete(next);
        throw new ForkdError("unavailable", `cannot create a network slot: ${errorMessage(e)}`, {}, e);
      }
      index = next;
    }
    this.busy.set(index, use);
    const s = slotOf(this.o.inst, index);
    try {
      await this.host(slotPolicy(this.o.inst, index, use.egress, this.rules));
      if (!sameNs(use.ns, this.idle)) await nft(nsTable(this.o.guest, s, use.ns), s.netns);
    } catch (e) {
      this.release(index);
      throw new ForkdError("unavailable", `cannot apply the network policy: ${errorMessage(e)}`, {}, e);
    }
    this.fill();
    return s;
  }

  /**
   * Replaces a busy slot's egress policy (one host nft transaction) and forgets the slot's
   * connection tracking on the host, so flows the old policy let through meet the new one.
   */
  async setPolicy(index: number, egress: Egress): Promise<void> {
    const use = this.busy.get(index);
    if (!use) throw new ForkdError("conflict", `network slot ${index} is not in use`);
    await this.host(slotPolicy(this.o.inst, index, egress, this.rules));
    this.busy.set(index, { ...use, egress });
    await forgetHostFlows(slotOf(this.o.inst, index));
  }

  /** Replaces a busy slot's namespace table (a port exposed while its child runs). */
  async setNs(index: number, ns: NsTableOptions): Promise<void> {
    const use = this.busy.get(index);
    if (!use) throw new ForkdError("conflict", `network slot ${index} is not in use`);
    if (sameNs(use.ns, ns)) return;
    const s = slotOf(this.o.inst, index);
    await nft(nsTable(this.o.guest, s, ns), s.netns);
    this.busy.set(index, { ...use, ns });
  }

  /**
   * Gives a slot back (its VMM has exited). Recycled in the background: rules to "nothing",
   * connection tracking in the slot and on the host forgotten; a slot that cannot be reset is
   * deleted and made again later.
   */
  release(index: number): void {
    const use = this.busy.get(index);
    if (!use || !this.busy.delete(index)) return;
    const s = slotOf(this.o.inst, index);
    void (async () => {
      try {
        await this.host(slotPolicy(this.o.inst, index, null, this.rules));
        if (!sameNs(use.ns, this.idle)) await nft(nsTable(this.o.guest, s, this.idle), s.netns);
        await conntrackFlush(["-F"], s.netns);
        await forgetHostFlows(s);
        if (this.closed) return;
        this.free.push(index);
      } catch (e) {
        this.o.log.warn("network: could not recycle a slot; deleting it", { index, error: errorMessage(e) });
        await ip(["netns", "del", s.netns]).catch(() => undefined);
        await ip(["link", "del", s.hostIf]).catch(() => undefined);
        this.created.delete(index);
        this.fill();
      }
    })();
  }

  /** Stops creating slots; leaves the kernel state for the next daemon (see reclaim). */
  close(): void {
    this.closed = true;
  }

  /** Removes everything of this instance from the kernel (no VMM may still use a slot). */
  async teardown(): Promise<void> {
    this.closed = true;
    await teardownInstance(this.o.inst);
  }
}

/**
 * Deletes an instance's namespaces, host interfaces and host table, whatever state they are in,
 * then its owner marker (./owners.ts).
 */
export async function teardownInstance(inst: NetInstance, ownersDir = OWNERS_DIR): Promise<void> {
  await nft(`add table inet ${tableName(inst)}\ndelete table inet ${tableName(inst)}\n`).catch(
    () => undefined,
  );
  for (const name of await listNetns()) {
    if (slotIndexOfNetns(inst, name) !== null) await ip(["netns", "del", name]).catch(() => undefined);
  }
  for (const link of await listLinks()) {
    if (link.startsWith(hostIfPrefix(inst))) await ip(["link", "del", link]).catch(() => undefined);
  }
  await forgetOwner(inst.id, ownersDir).catch(() => undefined);
}
