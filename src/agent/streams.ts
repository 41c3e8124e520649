/**
 * The streams of one agent connection: each request in flight has a stream id, the handler its
 * frames go to and, for a paced stream (EXEC output, READ data), its flow (flow.ts). Ids are
 * 32-bit, never 0 (the protocol's "no stream"), and not reused while in flight.
 */
import { ForkdError } from "../util/index.js";
import type { Frame } from "./codec.js";
import type { StreamFlow } from "./flow.js";

/** A stream's handler: a frame for it, or the error that ended the connection under it. */
export type StreamHandler = (frame: Frame | ForkdError) => void;

/** Requests one connection may have in flight. */
export const MAX_STREAMS = 1024;

/**
 * The stream of STREAMS (handover.ts), the first request of every connection: never handed out
 * for anything else, so it is never in flight in the guest when a new host asks.
 */
export const HANDOVER_STREAM = 0xffffffff;

export class StreamTable {
  private readonly handlers = new Map<number, StreamHandler>();
  private readonly flows = new Map<number, StreamFlow>();
  private next = 1;

  constructor(private readonly max = MAX_STREAMS) {}

  get size(): number {
    return this.handlers.size;
  }

  /** A new stream for `handler` (and `flow`, if paced). Throws resource_exhausted at the cap. */
  open(handler: StreamHandler, flow?: StreamFlow): number {
    if (this.handlers.size >= this.max)
      throw new ForkdError("resource_exhausted", "too many agent requests in flight");
    while (this.handlers.has(this.next) || this.next === 0 || this.next === HANDOVER_STREAM)
      this.next = (this.next + 1) >>> 0;
    const id = this.next;
    this.next = (this.next + 1) >>> 0;
    this.handlers.set(id, handler);
    if (flow) this.flows.set(id, flow);
    return id;
  }

  /**
   * Takes a stream the guest already has in flight (an earlier host's, handover.ts) for
   * `handler` (and `flow`): replaces whatever handled it.
   */
  claim(id: number, handler: StreamHandler, flow?: StreamFlow): void {
    this.handlers.set(id, handler);
    if (flow) this.flows.set(id, flow);
    else this.flows.delete(id);
  }

  /** New streams are numbered past `id` (the guest holds ids up to it). */
  numberPast(id: number): void {
    if (id >= this.next && id < HANDOVER_STREAM) this.next = (id + 1) >>> 0;
  }

  has(id: number): boolean {
    return this.handlers.has(id);
  }

  handler(id: number): StreamHandler | undefined {
    return this.handlers.get(id);
  }

  /** The ids in flight, oldest first. */
  ids(): number[] {
    return [...this.handlers.keys()];
  }

  /** Forgets a stream (unknown: nothing happens); later frames for it are dropped. */
  end(id: number): void {
    this.handlers.delete(id);
    this.flows.delete(id);
  }

  /** Whether some stream's consumer holds more than `cap` bytes. */
  holdsOver(cap: number): boolean {
    for (const f of this.flows.values()) if (f.held > cap) return true;
    return false;
  }

  /** Forgets every stream, then hands each handler `err`. */
  failAll(err: ForkdError): void {
    const handlers = [...this.handlers.values()];
    this.handlers.clear();
    this.flows.clear();
    for (const h of handlers) {
      try {
        h(err);
      } catch {
        /* handlers reject their own promises */
      }
    }
  }
}
