/**
 * A light fake guest's agent, in this process (no agent binary, no socket, no directory): it
 * answers what a sandbox's life needs of a guest without running anything in it, so a
 * benchmark holds thousands of fake sandboxes (bench/cluster-scale.ts). The handover (STREAMS:
 * nothing in flight), PING (protocol 1, no kernels, no features) and SYNC are answered OK;
 * flow-control and cancel frames get no reply, as the real agent's; every other request (exec,
 * files, eval, watch) is refused with ENOSYS, which the host reports as the guest not supporting
 * it. IDENTITY never reaches a guest (the agent port answers it).
 */
import { encodeFrame, FrameDecoder, Msg, Tag } from "../../src/agent/codec.js";

/** Frames the real agent never answers. */
const SILENT: ReadonlySet<number> = new Set([
  Msg.WINDOW,
  Msg.CANCEL,
  Msg.EVAL_INTERRUPT,
  Msg.STDIN,
  Msg.SIGNAL,
  Msg.RESIZE,
]);
const ENOSYS = 38;

export class LightAgent {
  private decoder = new FrameDecoder();
  private readonly started = Date.now();

  /** The replies to the bytes the host sent (whole frames only; a partial one waits for the rest). */
  push(bytes: Buffer): Buffer[] {
    const out: Buffer[] = [];
    let frames;
    try {
      frames = this.decoder.push(bytes);
    } catch {
      this.reset(); // garbage: dropped, as the agent drops a connection that sends it
      return out;
    }
    for (const f of frames) {
      if (SILENT.has(f.type)) continue;
      if (f.type === Msg.STREAMS || f.type === Msg.SYNC) out.push(encodeFrame(Msg.OK, f.stream));
      else if (f.type === Msg.PING)
        out.push(
          encodeFrame(Msg.OK, f.stream, [
            [Tag.VERSION, 1],
            [Tag.UPTIME_MS, Date.now() - this.started],
            [Tag.EVAL_READY, 0],
            [Tag.KERNELS, ""],
            [Tag.FEATURES, ""],
          ]),
        );
      else
        out.push(
          encodeFrame(Msg.ERROR, f.stream, [
            [Tag.ERRNO, ENOSYS],
            [Tag.MESSAGE, `the light fake guest does not run request 0x${f.type.toString(16)}`],
          ]),
        );
    }
    return out;
  }

  /** The host hung up: a partial frame is dropped (as the agent does on a reconnect). */
  reset(): void {
    this.decoder = new FrameDecoder();
  }
}
