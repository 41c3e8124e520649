/**
 * What one running child's network is, whatever its kind (none.ts, user.ts, slotted.ts): the
 * backend its VMM starts with, what it holds on the host, how it is given back, and how its
 * exposed ports and egress change while the VMM runs. The network service (../service.ts)
 * chooses the kind and makes it.
 */
import type { NetBackend } from "../backend.js";
import type { Egress, NetMode } from "../policy.js";

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

/** What adds a forward to a running VMM's user-mode stack (QemuVm). */
export interface HostForwarder {
  hostfwdAdd(rule: string): Promise<void>;
  hostfwdRemove(rule: string): Promise<void>;
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
