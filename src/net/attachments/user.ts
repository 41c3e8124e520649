/**
 * QEMU's slirp in the VMM, outside any slot (user mode with egress deny: `restrict=on`, nothing
 * out). Its own hostfwd listeners are the exposed ports, so it holds nothing on the host and
 * its egress cannot change. Also what a re-adopted child whose host side this daemon does not
 * hold is given (its slirp keeps its own forwards).
 */
import { ForkdError } from "../../util/index.js";
import type { NetBackend } from "../backend.js";
import { freePort, PortRelay } from "../expose.js";
import type { NetworkSpec } from "../policy.js";
import type { Attachment, HostForwarder, NetworkRecord } from "./attachment.js";
import { serial } from "./serial.js";

export class UserAttachment implements Attachment {
  readonly linkUp = true;
  private readonly one = serial();

  private constructor(
    readonly backend: NetBackend,
    readonly binary: string | undefined,
    private readonly rec: NetworkRecord,
    private readonly exposeAddr: string,
  ) {}

  /**
   * A child about to start: slirp forwards each exposed port from `exposeAddr`, on the port it
   * had before a pause (`prior`) where that is still free.
   */
  static async create(
    spec: NetworkSpec,
    guestIp: string,
    binary: string | undefined,
    exposeAddr: string,
    prior: NetworkRecord | undefined,
  ): Promise<UserAttachment> {
    const forwards = [];
    for (const p of spec.expose) {
      const want = Number(prior?.ports[String(p)]?.split(":")[1] ?? 0);
      forwards.push({ hostAddr: exposeAddr, hostPort: await portFor(exposeAddr, want), guestPort: p });
    }
    const ports = Object.fromEntries(
      forwards.map((f) => [String(f.guestPort), `${f.hostAddr}:${f.hostPort}`]),
    );
    const backend: NetBackend = { kind: "user", restrict: spec.egress.mode === "deny", forwards };
    return new UserAttachment(
      backend,
      binary,
      { ...spec, expose: [...spec.expose], guestIp, slot: null, ports },
      exposeAddr,
    );
  }

  /** A running child found after a daemon restart: nothing on the host side to take back. */
  static adopt(r: NetworkRecord, exposeAddr: string): UserAttachment {
    const spec: NetworkSpec = { mode: r.mode, egress: r.egress, expose: r.expose };
    return new UserAttachment(
      { kind: "none" },
      undefined,
      { ...spec, expose: [...spec.expose], guestIp: r.guestIp, slot: r.slot, ports: { ...r.ports } },
      exposeAddr,
    );
  }

  async start(): Promise<void> {}

  record(): NetworkRecord {
    return { ...this.rec, expose: [...this.rec.expose], ports: { ...this.rec.ports } };
  }

  async release(): Promise<void> {}

  expose(port: number, vmm: HostForwarder): Promise<void> {
    return this.one(async () => {
      const rec = this.rec;
      if (rec.expose.includes(port)) return;
      const hostPort = await freePort(this.exposeAddr);
      await vmm.hostfwdAdd(`tcp:${this.exposeAddr}:${hostPort}-${rec.guestIp ?? ""}:${port}`);
      rec.expose.push(port);
      rec.ports[String(port)] = `${this.exposeAddr}:${hostPort}`;
    });
  }

  unexpose(port: number, vmm: HostForwarder): Promise<void> {
    return this.one(async () => {
      const rec = this.rec;
      const at = rec.ports[String(port)];
      if (!rec.expose.includes(port) || !at) return;
      await vmm.hostfwdRemove(`tcp:${at}`);
      rec.expose = rec.expose.filter((p) => p !== port);
      delete rec.ports[String(port)];
    });
  }

  setEgress(): Promise<void> {
    return Promise.reject(
      new ForkdError(
        "conflict",
        'the egress of a user-mode sandbox created with egress "deny" is fixed (slirp restrict=on, in the VMM); create it with egress "allow" or "list" (then it runs in a netns slot, where the host enforces a policy that can change)',
        { field: "egress" },
      ),
    );
  }
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
