/**
 * Networking for sandboxes: the one place that decides, per child, which backend its VMM gets
 * for the guest NIC every snapshot's children share (./guest.ts), and that makes the attachment
 * owning what goes with it on the host (./attachments/). The sandbox service calls attach()
 * before it starts a child's VMM and the attachment's release() once it exits.
 *
 *   none   hub port to nothing, link down. No root needed (attachments/none.ts).
 *   user   QEMU's slirp in the VMM. Egress deny: restrict=on (nothing out, no DNS), no root
 *          needed (attachments/user.ts). Egress allow or a list: the VMM runs in a netns slot,
 *          so slirp's own sockets meet the slot's host rules (slirp alone would let the guest
 *          reach the host's loopback services at 10.0.2.2, and cannot express a list); without
 *          root that is refused unless FORKD_NET_USER_UNISOLATED=1 accepts the exposure.
 *   netns  the VMM in a slot namespace with a tap; NAT and the policy on the host
 *          (attachments/slotted.ts, also slirp in a slot).
 */
import { ForkdError, errorMessage } from "../util/index.js";
import type { Attachment, NetworkRecord } from "./attachments/attachment.js";
import { NoneAttachment } from "./attachments/none.js";
import { SlottedAttachment } from "./attachments/slotted.js";
import type { SlotHost } from "./attachments/slotted.js";
import { UserAttachment } from "./attachments/user.js";
import { detectNetwork } from "./capability.js";
import type { NetCapabilities } from "./capability.js";
import type { PortRelay } from "./expose.js";
import { GUEST_NET, sameGuestNet } from "./guest.js";
import type { GuestNet, RecordedNic } from "./guest.js";
import { parseHostAllow } from "./host-access.js";
import { setUpInstance } from "./instance-setup.js";
import { parseIpv4 } from "./policy.js";
import type { Egress, NetMode, NetworkSpec } from "./policy.js";
import type { SlotPool } from "./pool.js";
import type { Logger } from "../util/index.js";
import { slotOf } from "./slots.js";
import type { NetInstance } from "./slots.js";

export type { Attachment, HostForwarder, NetworkRecord } from "./attachments/attachment.js";

export interface NetworkServiceOptions {
  dataDir: string;
  env?: NodeJS.ProcessEnv;
  log: Logger;
  qemuBinary: string;
  jailer: string | null;
  /** Host TCP ports no sandbox may reach (the daemon's API). */
  protectedPorts: number[];
  /** Where instances' owner markers live (./owners.ts; tests). */
  ownersDir?: string;
}

export class NetworkService {
  private readonly relays = new Set<PortRelay>();
  /** What slotted attachments share (null: no slots here). */
  private readonly slots: SlotHost | null;

  private constructor(
    readonly caps: NetCapabilities,
    private readonly pool: SlotPool | null,
    readonly instance: NetInstance | null,
    private readonly exposeAddr: string,
    private readonly userUnisolated: boolean,
    private readonly log: Logger,
  ) {
    this.slots = pool ? { pool, exposeAddr, resolver: caps.resolver, relays: this.relays } : null;
  }

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
    // Parsed before anything is set up: a mistyped opening stops the daemon, never widens it.
    const hostOpen = parseHostAllow(env.FORKD_NET_HOST_ALLOW);
    if (hostOpen.length > 0)
      o.log.warn("network: the operator opened host destinations to sandboxes (FORKD_NET_HOST_ALLOW)", {
        open: hostOpen.map((r) =>
          r.ports ? `${r.cidr}:${r.ports.map(([a, b]) => (a === b ? a : `${a}-${b}`)).join(",")}` : r.cidr,
        ),
      });
    const warm = intEnv(env, "FORKD_NET_SLOTS", 4);
    const max = intEnv(env, "FORKD_NET_MAX_SLOTS", 64);
    let pool: SlotPool | null = null;
    let inst: NetInstance | null = null;
    if (caps.netns.ok && max > 0) {
      try {
        ({ inst, pool } = await setUpInstance({
          dataDir: o.dataDir,
          env,
          log: o.log,
          resolver: caps.resolver,
          protectedPorts: o.protectedPorts,
          hostOpen,
          warm,
          max,
          ownersDir: o.ownersDir,
        }));
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
  static disabled(log: Logger): NetworkService {
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
  check(spec: NetworkSpec, nic: RecordedNic | undefined, tag: string): void {
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
  async attach(spec: NetworkSpec, nic: RecordedNic | undefined, prior?: NetworkRecord): Promise<Attachment> {
    if (spec.mode === "none" || !nic) return new NoneAttachment();
    const binary = this.caps.user.binary ?? undefined;
    if (spec.mode === "user" && !this.userInSlot(spec.egress)) {
      return UserAttachment.create(spec, nic.addr, binary, this.exposeAddr, prior);
    }
    if (!this.slots) throw unavailable(spec.mode, this.caps.netns.reason);
    return SlottedAttachment.acquire(this.slots, spec, nic.addr, binary, prior);
  }

  /** A running child's network found after a daemon restart (before reclaim()). */
  adopt(r: NetworkRecord): Attachment {
    if (r.mode === "none") return new NoneAttachment();
    if (r.slot === null || !this.slots || !this.instance || r.slot >= this.instance.maxSlots) {
      // slirp with its own hostfwd: nothing on the host side to take back.
      return UserAttachment.adopt(r, this.exposeAddr);
    }
    return SlottedAttachment.adopt(this.slots, slotOf(this.instance, r.slot), r);
  }

  /** After adopt()s: takes the kernel state of this instance back (see SlotPool.reclaim). */
  async reclaim(): Promise<void> {
    try {
      await this.pool?.reclaim();
    } catch (e) {
      this.log.warn("network: reclaiming slots failed", { error: errorMessage(e) });
    }
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
export const guestNetOf = (n: RecordedNic): GuestNet => ({
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
