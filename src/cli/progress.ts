/**
 * How a long operation shows what it is doing. On a terminal: one live line (elapsed time,
 * phase, layer, bytes, the daemon's message), redrawn as events come and every second, kept
 * as a line of history when the phase changes. Elsewhere (a pipe, a log): plain lines, one per
 * daemon event, and the CLI's own byte counts at most every few seconds.
 */

/** One step of progress: the daemon's events have these fields (all but `message` optional). */
export interface ProgressEvent {
  message: string;
  phase?: string | undefined;
  layer?: { index: number; count: number; path: string } | undefined;
  done_bytes?: number | undefined;
  total_bytes?: number | undefined;
}

/** Where it is drawn: stderr in the CLI, a fake terminal in tests. */
export interface ProgressOut {
  write(s: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

export interface ProgressOpts {
  now?: () => number;
  /** Redraw period of the live line on a terminal (0: none). */
  tickMs?: number;
  /** Non-terminal: the least time between two lines of the CLI's own counts. */
  quietMs?: number;
}

export const mib = (n: number): string => `${(n / 2 ** 20).toFixed(1)} MiB`;

/** "120.0 of 500.0 MiB (24%)", "120.0 MiB", or "" without bytes. */
export function bytesText(done: number | undefined, total: number | undefined): string {
  if (done === undefined) return "";
  if (total === undefined || total <= 0) return mib(done);
  return `${(done / 2 ** 20).toFixed(1)} of ${mib(total)} (${Math.min(100, Math.floor((done / total) * 100))}%)`;
}

export class ProgressView {
  private readonly t0: number;
  private readonly now: () => number;
  private readonly tty: boolean;
  private current: ProgressEvent | null = null;
  private drawn = false;
  private lastPlain = -Infinity;
  private readonly tick: NodeJS.Timeout | null;
  private readonly quietMs: number;

  constructor(
    private readonly out: ProgressOut,
    o: ProgressOpts = {},
  ) {
    this.now = o.now ?? Date.now;
    this.t0 = this.now();
    this.tty = out.isTTY === true;
    this.quietMs = o.quietMs ?? 5_000;
    const tickMs = o.tickMs ?? 1_000;
    this.tick = this.tty && tickMs > 0 ? setInterval(() => this.draw(), tickMs) : null;
    this.tick?.unref();
  }

  private elapsed(): string {
    return `[${((this.now() - this.t0) / 1000).toFixed(1)}s]`;
  }

  /** The live line's text (no elapsed time): phase, layer, bytes, message. */
  static summary(ev: ProgressEvent): string {
    const parts: string[] = [];
    if (ev.phase) parts.push(ev.phase);
    if (ev.layer) parts.push(`layer ${ev.layer.index}/${ev.layer.count}`);
    const b = bytesText(ev.done_bytes, ev.total_bytes);
    if (b) parts.push(b);
    const head = parts.join(" · ");
    return head && ev.message ? `${head} — ${ev.message}` : head || ev.message;
  }

  /** A daemon event: always shown. */
  event(ev: ProgressEvent): void {
    if (this.tty) return this.live(ev);
    const b = bytesText(ev.done_bytes, ev.total_bytes);
    this.plain(`${ev.message}${b && ev.total_bytes !== undefined ? ` [${b}]` : ""}`);
  }

  /** The CLI's own count (bytes sent or received, a wait): live on a terminal, throttled elsewhere. */
  local(ev: ProgressEvent): void {
    if (this.tty) return this.live(ev);
    const changed = this.current?.phase !== ev.phase;
    this.current = ev;
    if (changed || this.now() - this.lastPlain >= this.quietMs) this.plain(ProgressView.summary(ev));
  }

  /** Ends the view: the live line stays as the last line of history; the timer stops. */
  end(): void {
    if (this.tick) clearInterval(this.tick);
    if (this.tty && this.drawn) this.out.write("\n");
    this.drawn = false;
  }

  private plain(text: string): void {
    this.lastPlain = this.now();
    this.out.write(`  ${this.elapsed()} ${text}\n`);
  }

  private live(ev: ProgressEvent): void {
    // A new phase keeps the last line of the one before as history.
    if (this.drawn && this.current && ev.phase !== this.current.phase) {
      this.out.write("\n");
      this.drawn = false;
    }
    this.current = ev;
    this.draw();
  }

  private draw(): void {
    if (!this.current) return;
    const width = Math.max(20, (this.out.columns || 80) - 1);
    let line = `  ${this.elapsed()} ${ProgressView.summary(this.current)}`;
    if (line.length > width) line = line.slice(0, width - 1) + "…";
    this.out.write(`\r\x1b[2K${line}`);
    this.drawn = true;
  }
}
