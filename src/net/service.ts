/**
 * Networking for sandboxes: the one place that decides, per child, which backend its VMM gets
 * for the guest NIC every snapshot's children share (./guest.ts), and that owns what goes with
 * it on the host (a netns slot and its rules, relays for exposed ports). The sandbox service
 * calls attach() before it starts a child's VMM and the attachment's release() once it exits.
 *
 *   none   hub port to nothing, link down. No root needed.
 *   user   QEMU's slirp in the VMM. Egress deny: restrict=on (nothing out, no DNS), no root
 *          needed. Egress allow or a list: the VMM runs in a netns slot, so slirp's own sockets
 *          meet the slot's host rules (slirp alone would let the guest reach the host's
 *          loopback services at 10.0.2.2, and cannot express a list); without root that is
 *          refused unless FORKD_NET_USER_UNISOLATED=1 accepts the exposure.
 *   netns  the VMM in a slot namespace with a tap; NAT and the policy on the host.
 */
import { writeFile } from "node:fs/promises";
import { ForkdError, errorMessage } from "../util/errors.js";
import type { NicMeta } from "../snapshot/meta.js";
import type { NetBackend } from "../vmm/config.js";
import { detectNetwork } from "./capability.js";
import type { NetCapabilities } from "./capability.js";
import { freePort, PortRelay } from "./expose.js";
import { GUEST_NET, sameGuestNet } from "./guest.js";
import type { GuestNet } from "./guest.js";
import { cidrContains, parseCidr, parseIpv4 } from "./policy.js";
import type { Egress, NetMode, NetworkSpec } from "./policy.js";
import { orphanInstances, recordOwner } from "./owners.js";
import { SlotPool, teardownInstance } from "./pool.js";
import type { PoolLog, SlotUse } from "./pool.js";
import { blockText, hostIfPrefix, instanceId, instanceOf, slotOf } from "./slots.js";
import type { NetInstance, Slot } from "./slots.js";
import { hostRoutes, sysctl } from "./sys.js";

/** A sandbox's network, as persisted with its record (sandbox.json). */
export interface NetworkRecord {
  mode: NetMode;
  egress: Egress;
  expose: number[];
  /** The guest's address (null without a network). */
  guestIp: string | null;
  /** The netns slot its VMM runs in, while it runs (null: none). */
  slot: number | null;
  /** Exposed guest port → "host:port" where it answers, while the sandbox runs. */
  ports: Record<string, string>;
}

/** One running child's network, from attach() (or adopt()) to release(). */
export interface Attachment {
  /** What its VMM is started with. */
  readonly backend: NetBackend;
  /** The namespace its VMM starts in. */
  readonly netns?: string;
  /** A QEMU binary to use instead of the default one (for slirp). */
  readonly binary?: string;
  /** Whether the guest's link should be up. */
  readonly linkUp: boolean;
  /** Once its VMM runs: starts what relays exposed ports. */
  start(): Promise<void>;
  record(): NetworkRecord;
  /** Gives everything back (VMM gone). Idempotent. */
  release(): Promise<void>;
  /**
   * Exposes one more guest TCP port while the VMM runs (record() then lists it). `vmm` adds a
   * slirp forward where the backend is slirp's. One call at a time per attachment.
   */
  expose(port: number, vmm: HostForwarder): Promise<void>;
  /** Stops exposing a guest port (not exposed: nothing changes). */
  unexpose(port: number, vmm: HostForwarder): Promise<void>;
  /** Replaces the egress policy while the VMM runs (only where the host enforces it: a slot). */
  setEgress(egress: Egress): Promise<void>;
}

/** What adds a forward to a running VMM's user-mode stack (QemuVm). */
export interface HostForwarder {
  hostfwdAdd(rule: string): Promise<void>;
  hostfwdRemove(rule: string): Promise<void>;
}

/** Runs `fn`s one after another (a failed one does not stop the next). */
function serial(): <T>(fn: () => Promise<T>) => Promise<T> {
  let tail: Promise<unknown> = Promise.resolve();
  return (fn) => {
    const next = tail.then(fn);
    tail = next.catch(() => undefined);
    return next;
  };
}

const noNetwork = () =>
  new ForkdError(
    "invalid_argument",
    "the sandbox has no network: a port can be exposed on sandboxes created with network mode user or netns",
    { field: "port" },
  );

export interface NetworkServiceOptions {
  dataDir: string;
  env?: NodeJS.ProcessEnv;
  log: PoolLog;
  qemuBinary: string;
  jailer: string | null;
  /** Host TCP ports no sandbox may reach (the daemon's API). */
  protectedPorts: number[];
  /** Where instances' owner markers live (./owners.ts; tests). */
  ownersDir?: string;
}

const NONE_ATTACHMENT: Attachment = {
  backend: { kind: "none" },
  linkUp: false,
  start: async () => undefined,
  record: () => ({
    mode: "none",
    egress: { mode: "deny", allow: [], dns: false },
    expose: [],
    guestIp: null,
    slot: null,
    ports: {},
  }),
  release: async () => undefined,
  expose: () => Promise.reject(noNetwork()),
  unexpose: async () => undefined,
  setEgress: () => Promise.reject(noNetwork()),
};

export class NetworkService {
  private readonly relays = new Set<PortRelay>();

  private constructor(
    readonly caps: NetCapabilities,
    private readonly pool: SlotPool | null,
    readonly instance: NetInstance | null,
    private readonly exposeAddr: string,
    private readonly userUnisolated: boolean,
    private readonly log: PoolLog,
  ) {}

  static async start(o: NetworkServiceOptions): Promise<NetworkService> {
    const env = o.env ?? process.env;
    const caps = await detectNetwork({ qemuBinary: o.qemuBinary, jailer: o.jailer });
    const exposeAddr = env.FORKD_EXPOSE_ADDR ?? "127.0.0.1";
    if (parseIpv4(exposeAddr) === null) {
      throw new ForkdError(
        "invalid_argument",
        `FORKD_EXPOSE_ADDR must be an IPv4 address (got ${exposeAddr})`,
      );
    }
    const warm = intEnv(env, "FORKD_NET_SLOTS", 4);
    const max = intEnv(env, "FORKD_NET_MAX_SLOTS", 64);
    let pool: SlotPool | null = null;
    let inst: NetInstance | null = null;
    if (caps.netns.ok && max > 0) {
      try {
        inst = instanceOf(instanceId(o.dataDir, env), max, env);
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
        pool = new SlotPool({
          inst,
          guest: GUEST_NET,
          resolver: caps.resolver,
          protectedPorts: o.protectedPorts,
          warm: Math.min(warm, max),
          log: o.log,
        });
      } catch (e) {
        caps.netns = { ok: false, reason: errorMessage(e) };
        inst = null;
      }
    } else if (caps.netns.ok) {
      caps.netns = { ok: false, reason: "FORKD_NET_MAX_SLOTS=0" };
    }
    if (!caps.netns.ok) o.log.warn("network: netns mode unavailable", { reason: caps.netns.reason });
    if (caps.netns.ok && !caps.dns.ok) o.log.warn("network: " + caps.dns.reason);
    return new NetworkService(caps, pool, inst, exposeAddr, env.FORKD_NET_USER_UNISOLATED === "1", o.log);
  }

  /** A service with no host networking at all (tests that never start a VM; `none` only). */
  static disabled(log: PoolLog): NetworkService {
    const no = { ok: false, reason: "networking disabled" };
    return new NetworkService(
      { user: { ...no, binary: null }, netns: no, resolver: null, dns: no },
      null,
      null,
      "127.0.0.1",
      false,
      log,
    );
  }

  status(): { user: boolean; netns: boolean; slots: { free: number; busy: number; max: number } | null } {
    return { user: this.caps.user.ok, netns: this.caps.netns.ok, slots: this.pool?.status() ?? null };
  }

  /** Whether a user-mode child with this egress runs in a slot. */
  private userInSlot(e: Egress): boolean {
    return e.mode !== "deny" && !(e.mode === "allow" && this.userUnisolated && !this.pool);
  }

  /**
   * Refuses, before anything starts, a network this host or this snapshot cannot give: clear
   * errors naming what is missing.
   */
  check(spec: NetworkSpec, nic: NicMeta | undefined, tag: string): void {
    if (spec.mode === "none") return;
    if (!nic) {
      throw new ForkdError(
        "invalid_argument",
        `snapshot ${tag} has no network device (it was made before networking): make it again to give its children a network`,
        { field: "network.mode", tag },
      );
    }
    if (!sameGuestNet(guestNetOf(nic), GUEST_NET)) {
      throw new ForkdError(
        "invalid_argument",
        `snapshot ${tag} was made with another guest network (${nic.addr}/${nic.prefix}) than this daemon's (${GUEST_NET.addr}/${GUEST_NET.prefix}): make it again`,
        { field: "network.mode", tag },
      );
    }
    if (spec.mode === "user") {
      if (!this.caps.user.ok) throw unavailable("user", this.caps.user.reason);
      if (!this.userInSlot(spec.egress)) return;
      if (!this.pool) {
        const what =
          spec.egress.mode === "list"
            ? "an egress allow-list under user networking is enforced in a netns slot"
            : "user networking with egress allow runs in a netns slot, or its guest could reach this host's own services (slirp maps 10.0.2.2 to the host's loopback); set FORKD_NET_USER_UNISOLATED=1 to accept that, or use egress deny";
        throw unavailable("user", `${what}, and netns is unavailable here: ${this.caps.netns.reason}`);
      }
      return;
    }
    if (!this.pool) throw unavailable("netns", this.caps.netns.reason);
  }

  /** Sets up the network of one child about to start (`prior`: its record before a pause). */
  async attach(spec: NetworkSpec, nic: NicMeta | undefined, prior?: NetworkRecord): Promise<Attachment> {
    if (spec.mode === "none" || !nic) return NONE_ATTACHMENT;
    const guestIp = nic.addr;
    const binary = this.caps.user.binary ?? undefined;
    if (spec.mode === "user" && !this.userInSlot(spec.egress)) {
      // slirp in the VMM, no slot: its hostfwd listeners are the exposed ports.
      const forwards = [];
      for (const p of spec.expose) {
        const want = Number(prior?.ports[String(p)]?.split(":")[1] ?? 0);
        forwards.push({
          hostAddr: this.exposeAddr,
          hostPort: await portFor(this.exposeAddr, want),
          guestPort: p,
        });
      }
      const ports = Object.fromEntries(
        forwards.map((f) => [String(f.guestPort), `${f.hostAddr}:${f.hostPort}`]),
      );
      return this.simple({ kind: "user", restrict: spec.egress.mode === "deny", forwards }, binary, {
        ...spec,
        expose: [...spec.expose],
        guestIp,
        slot: null,
        ports,
      });
    }
    const pool = this.pool;
    if (!pool) throw unavailable(spec.mode, this.caps.netns.reason);
    const tap = spec.mode === "netns";
    const slot = await pool.acquire({ egress: spec.egress, ns: this.nsUse(tap, spec.expose) });
    const backend: NetBackend = tap
      ? { kind: "tap", ifname: slot.tapIf }
      : {
          kind: "user",
          restrict: false,
          forwards: spec.expose.map((p) => ({ hostAddr: slot.nsAddr, hostPort: p, guestPort: p })),
        };
    return this.slotted(slot, backend, tap ? undefined : binary, spec, guestIp, prior);
  }

  /** A running child's network found after a daemon restart (before reclaim()). */
  adopt(r: NetworkRecord): Attachment {
    if (r.mode === "none") return NONE_ATTACHMENT;
    const spec: NetworkSpec = { mode: r.mode, egress: r.egress, expose: r.expose };
    if (r.slot === null || !this.pool || !this.instance || r.slot >= this.instance.maxSlots) {
      // slirp with its own hostfwd: nothing on the host side to take back.
      return this.simple({ kind: "none" }, undefined, {
        ...spec,
        expose: [...spec.expose],
        guestIp: r.guestIp,
        slot: r.slot,
        ports: { ...r.ports },
      });
    }
    this.pool.adopt(r.slot, { egress: r.egress, ns: this.nsUse(r.mode === "netns", r.expose) });
    return this.slotted(slotOf(this.instance, r.slot), { kind: "none" }, undefined, spec, r.guestIp, r);
  }

  /**
   * A slot namespace's table for a child. slirp without exposed ports needs nothing of it (its
   * sockets are the namespace's own), so it gets the free slot's table and taking the slot
   * changes nothing there.
   */
  private nsUse(tap: boolean, expose: number[]): SlotUse["ns"] {
    const backend = tap || expose.length === 0 ? "tap" : "user";
    return { backend, dnsTo: this.caps.resolver, expose };
  }

  /** After adopt()s: takes the kernel state of this instance back (see SlotPool.reclaim). */
  async reclaim(): Promise<void> {
    try {
      await this.pool?.reclaim();
    } catch (e) {
      this.log.warn("network: reclaiming slots failed", { error: errorMessage(e) });
    }
  }

  /** slirp in the VMM, outside any slot: its hostfwd listeners are the exposed ports. */
  private simple(backend: NetBackend, binary: string | undefined, rec: NetworkRecord): Attachment {
    const one = serial();
    return {
      backend,
      binary,
      linkUp: true,
      start: async () => undefined,
      record: () => ({ ...rec, expose: [...rec.expose], ports: { ...rec.ports } }),
      release: async () => undefined,
      expose: (port, vmm) =>
        one(async () => {
          if (rec.expose.includes(port)) return;
          const hostPort = await freePort(this.exposeAddr);
          await vmm.hostfwdAdd(`tcp:${this.exposeAddr}:${hostPort}-${rec.guestIp ?? ""}:${port}`);
          rec.expose.push(port);
          rec.ports[String(port)] = `${this.exposeAddr}:${hostPort}`;
        }),
      unexpose: (port, vmm) =>
        one(async () => {
          const at = rec.ports[String(port)];
          if (!rec.expose.includes(port) || !at) return;
          await vmm.hostfwdRemove(`tcp:${at}`);
          rec.expose = rec.expose.filter((p) => p !== port);
          delete rec.ports[String(port)];
        }),
      setEgress: () =>
        Promise.reject(
          new ForkdError(
            "conflict",
            'the egress of a user-mode sandbox created with egress "deny" is fixed (slirp restrict=on, in the VMM); create it with egress "allow" or "list" (then it runs in a netns slot, where the host enforces a policy that can change)',
            { field: "egress" },
          ),
        ),
    };
  }

  private slotted(
    slot: Slot,
    backend: NetBackend,
    binary: string | undefined,
    spec: NetworkSpec,
    guestIp: string | null,
    prior: NetworkRecord | undefined,
  ): Attachment {
    const relays = new Map<number, PortRelay>();
    const ports: Record<string, string> = {};
    let expose = [...spec.expose];
    let egress = spec.egress;
    const tap = spec.mode === "netns";
    const one = serial();
    let released = false;
    const relay = async (p: number) => {
      const want = Number(prior?.ports[String(p)]?.split(":")[1] ?? 0);
      const r = await PortRelay.listen(this.exposeAddr, want, { host: slot.nsAddr, port: p });
      relays.set(p, r);
      this.relays.add(r);
      ports[String(p)] = `${r.hostAddr}:${r.hostPort}`;
    };
    const release = async () => {
      if (released) return;
      released = true;
      await Promise.all([...relays.values()].map((r) => r.close()));
      for (const r of relays.values()) this.relays.delete(r);
      this.pool?.release(slot.index);
    };
    return {
      backend,
      binary,
      netns: slot.netnsPath,
      linkUp: true,
      start: async () => {
        for (const p of expose) await relay(p);
      },
      record: () => ({
        ...spec,
        egress,
        expose: [...expose],
        guestIp,
        slot: released ? null : slot.index,
        ports: { ...ports },
      }),
      release,
      expose: (port, vmm) =>
        one(async () => {
          if (expose.includes(port)) return;
          if (released || !this.pool) throw new ForkdError("conflict", "the sandbox's network is gone");
          const next = [...expose, port];
          // slirp in the slot listens at the slot's address; a tap's guest is DNATed to there.
          if (!tap) await vmm.hostfwdAdd(`tcp:${slot.nsAddr}:${port}-${guestIp ?? ""}:${port}`);
          await this.pool.setNs(slot.index, this.nsUse(tap, next));
          await relay(port);
          expose.push(port);
        }),
      unexpose: (port, vmm) =>
        one(async () => {
          if (!expose.includes(port)) return;
          if (released || !this.pool) throw new ForkdError("conflict", "the sandbox's network is gone");
          const next = expose.filter((p) => p !== port);
          const r = relays.get(port);
          await r?.close();
          if (r) this.relays.delete(r);
          relays.delete(port);
          delete ports[String(port)];
          expose = next;
          await this.pool.setNs(slot.index, this.nsUse(tap, next));
          if (!tap) await vmm.hostfwdRemove(`tcp:${slot.nsAddr}:${port}`);
        }),
      setEgress: (next) =>
        one(async () => {
          if (released || !this.pool) throw new ForkdError("conflict", "the sandbox's network is gone");
          await this.pool.setPolicy(slot.index, next);
          egress = next;
        }),
    };
  }

  /** Daemon shutdown: stop relaying; slots stay for the children left running (see reclaim). */
  async close(): Promise<void> {
    this.pool?.close();
    await Promise.all([...this.relays].map((r) => r.close()));
    this.relays.clear();
  }

  /** Removes every slot of this instance from the kernel (no child may still run in one). */
  async teardown(): Promise<void> {
    await this.close();
    await this.pool?.teardown();
  }
}

const unavailable = (mode: NetMode, reason: string) =>
  new ForkdError("unavailable", `network mode "${mode}" is unavailable on this host: ${reason}`, {
    field: "network.mode",
    reason,
  });

/** The guest network a snapshot's children have. */
export const guestNetOf = (n: NicMeta): GuestNet => ({
  addr: n.addr,
  prefix: n.prefix,
  gateway: n.gateway,
  dns: n.dns,
  gatewayMac: n.gatewayMac,
  mac: n.mac,
});

function intEnv(env: NodeJS.ProcessEnv, name: string, dflt: number): number {
  const v = env[name];
  if (v === undefined || v === "") return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0 || n > 65536) {
    throw new ForkdError("invalid_argument", `${name} must be a non-negative integer (got ${v})`);
  }
  return n;
}

/** `want` if it is free on `addr` (a port a sandbox had before its pause), else any free port. */
async function portFor(addr: string, want: number): Promise<number> {
  if (want > 0) {
    try {
      const r = await PortRelay.listen(addr, want, { host: addr, port: 1 });
      const got = r.hostPort;
      await r.close();
      if (got === want) return want;
    } catch {
      /* taken */
    }
  }
  return freePort(addr);
}

/** Refuses a slot block that overlaps a route of the host's that is not one of ours. */
/** Removes the instances whose data directory is gone and held by no daemon (./owners.ts). */
async function removeOrphans(ownId: string, log: PoolLog, dir?: string): Promise<void> {
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
