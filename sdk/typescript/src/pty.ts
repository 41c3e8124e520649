/**
 * `sandbox.pty`: E2B's pseudo-terminals (create, sendInput, resize, kill) over forkd's exec with
 * `pty: {rows, cols}` and POST /v1/sandboxes/{id}/commands/{pid}/resize (the agent helper's
 * routes). Output arrives as bytes on `onData` (and as `{ pty }` when iterating the handle).
 */
import type { CommandHandle, Commands } from "./commands.js";
import type { Transport } from "./transport.js";

export interface PtyCreateOpts {
  rows: number;
  cols: number;
  onData?: (data: Uint8Array) => void;
  cwd?: string;
  envs?: Record<string, string>;
  user?: string;
  /** Kills it after this long (default 60 000 ms; 0: never). */
  timeoutMs?: number;
}

const SHELL = "if command -v bash >/dev/null; then exec bash -i -l; else exec sh -i; fi";

export class Pty {
  /** @internal */
  constructor(
    private readonly commands: Commands,
    private readonly t: Transport,
    private readonly id: string,
  ) {}

  /** Starts a login shell (bash, else sh) on a terminal; its handle at once (stdin stays open). */
  create(opts: PtyCreateOpts): Promise<CommandHandle> {
    return this.commands.run(SHELL, {
      background: true,
      pty: { rows: opts.rows, cols: opts.cols },
      ...(opts.onData ? { onPty: opts.onData } : {}),
      ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
      ...(opts.envs ? { envs: opts.envs } : {}),
      ...(opts.user !== undefined ? { user: opts.user } : {}),
      timeoutMs: opts.timeoutMs ?? 60_000,
    });
  }

  /** Input to the terminal (Ctrl-C is the byte 0x03). */
  sendInput(pid: number, data: Uint8Array | string): Promise<void> {
    return this.commands.sendStdin(pid, data);
  }

  /** E2B's Python name for sendInput. */
  sendStdin(pid: number, data: Uint8Array | string): Promise<void> {
    return this.commands.sendStdin(pid, data);
  }

  async resize(pid: number, size: { rows: number; cols: number }): Promise<void> {
    await this.t.json("POST", `/v1/sandboxes/${this.id}/commands/${pid}/resize`, {
      json: { rows: size.rows, cols: size.cols },
    });
  }

  /** SIGKILLs the terminal's process group. False if it is not running. */
  kill(pid: number): Promise<boolean> {
    return this.commands.kill(pid);
  }
}
