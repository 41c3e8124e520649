/**
 * A fake VM's agent channel (QEMU's virtio-serial chardev): one host connection at a time,
 * relayed frame by frame to the guest. Frames wait while the VM is paused or the guest is not
 * connected; what the guest sends while no host is connected is lost. IDENTITY is answered here
 * (the agent runs on the host: it must not set the host's clock or name), and recorded.
 */
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
import { AgentClient } from "../../src/agent/client.js";
import { encodeFrame, FrameDecoder, Msg, Tag, strField } from "../../src/agent/codec.js";
import type { Frame } from "../../src/agent/codec.js";
import { duplexPair } from "./duplex-pair.js";
import type { FakeGuest } from "./guest.js";

const encode = (f: Frame): Buffer =>
  encodeFrame(
    f.type,
    f.stream,
    f.fields.map((x) => [x.tag, x.value] as const),
  );

export class AgentPort {
  private host: Duplex | null = null;
  private fromHost = new FrameDecoder();
  private fromGuest = new FrameDecoder();
  /** Host frames not yet delivered (a Buffer), or IDENTITY replies due (a stream id). */
  private queue: Array<Buffer | number> = [];
  private guest: FakeGuest | null = null;
  private running = false;
  private readonly onGuestData = (d: Buffer) => this.guestData(d);
  private readonly onGuestConnected = () => {
    this.fromGuest = new FrameDecoder();
    this.flush();
  };

  constructor(private readonly label: string) {}

  /** The guest behind the port (null: none yet, as before device state loads). */
  attach(g: FakeGuest | null): void {
    this.guest?.off("data", this.onGuestData).off("connected", this.onGuestConnected);
    this.guest = g;
    g?.on("data", this.onGuestData).on("connected", this.onGuestConnected);
    this.flush();
  }

  get attached(): FakeGuest | null {
    return this.guest;
  }

  /** Whether the guest runs (its vCPUs): a paused guest answers nothing. */
  setRunning(r: boolean): void {
    this.running = r;
    this.flush();
  }

  /** A new host connection; an earlier one is cut. */
  connect(): AgentClient {
    return AgentClient.fromSocket(
      this.dial() as unknown as Socket,
      this.label,
      () => Promise.resolve(this.dial() as unknown as Socket),
      { handover: true },
    );
  }

  private dial(): Duplex {
    this.host?.destroy();
    const [mine, theirs] = duplexPair();
    this.host = mine;
    this.fromHost = new FrameDecoder();
    mine.on("data", (d: Buffer) => {
      if (this.host === mine) this.hostData(d);
    });
    mine.on("close", () => {
      if (this.host !== mine) return;
      this.host = null;
      this.queue = [];
      // The guest sees the hang-up: it drops partial input and connects again.
      this.guest?.hangup();
    });
    return theirs;
  }

  /** The VMM is gone: its host connection closes. */
  close(): void {
    const h = this.host;
    this.host = null;
    h?.destroy();
    this.attach(null);
  }

  private hostData(d: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.fromHost.push(d);
    } catch {
      this.host?.destroy();
      return;
    }
    for (const f of frames) {
      if (f.type === Msg.IDENTITY) {
        this.guest?.identities.push({
          hostname: strField(f.fields, Tag.HOSTNAME) ?? "",
          sandboxId: strField(f.fields, Tag.SANDBOX_ID) ?? "",
        });
        this.queue.push(f.stream);
      } else this.queue.push(encode(f));
    }
    this.flush();
  }

  private guestData(d: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.fromGuest.push(d);
    } catch {
      this.guest?.hangup();
      return;
    }
    for (const f of frames) this.host?.write(encode(f));
  }

  private flush(): void {
    const g = this.guest;
    // A guest whose agent is not connected (starting, reconnecting, silent) answers nothing.
    if (!this.running || !g?.connected || !this.host) return;
    while (this.queue.length > 0) {
      const next = this.queue[0]!;
      if (typeof next === "number") this.host.write(encodeFrame(Msg.OK, next));
      else if (!g.write(next)) return;
      this.queue.shift();
    }
  }
}
