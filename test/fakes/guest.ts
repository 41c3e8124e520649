/**
 * A fake VM's guest: the real guest agent binary (guest/agent/forkd-agent) run on the host,
 * connected to a unix socket of its own the way the guest's virtio-serial port is to QEMU: when
 * the host end hangs up it drops partial input and connects again. A paused VM's guest does not
 * run (SIGSTOP). `silent` guests have no agent: nothing they are sent is ever answered.
 */
import { execFileSync, spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import type { Server, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";
import { LightAgent } from "./light-agent.js";

const SETPRIV = "/usr/bin/setpriv";

export class FakeGuest extends EventEmitter {
  private conn: Socket | null = null;
  private dead = false;
  /** A light guest's agent (null: a real agent process, or none). */
  private light: LightAgent | null = null;
  /** A light guest's replies held while it is frozen. */
  private held: Buffer[] = [];
  private frozen = false;
  /** A light guest's connection count: replies to an earlier connection are dropped. */
  private generation = 0;
  /** Identities the host gave it (IDENTITY never reaches the agent: it would rename the host). */
  readonly identities: Array<{ hostname: string; sandboxId: string }> = [];
  readonly name = `guest-${randomBytes(4).toString("hex")}`;

  private constructor(
    /** Its scratch directory (files the test's commands may write). */
    readonly dir: string,
    private readonly server: Server | null,
    private readonly proc: ChildProcess | null,
  ) {
    super();
    server?.on("connection", (c: Socket) => {
      if (this.dead) return void c.destroy();
      this.conn?.destroy();
      this.conn = c;
      c.on("data", (d: Buffer) => {
        if (this.conn === c) this.emit("data", d);
      });
      c.on("error", () => undefined);
      c.on("close", () => {
        if (this.conn === c) this.conn = null;
      });
      this.emit("connected");
    });
  }

  static async start(o: { python?: boolean; silent?: boolean; light?: boolean } = {}): Promise<FakeGuest> {
    if (o.light && !o.silent) {
      const g = new FakeGuest("/nonexistent/forkd-light-guest", null, null);
      g.light = new LightAgent();
      return g;
    }
    const dir = await mkdtemp(join(tmpdir(), "forkd-fake-guest-"));
    if (o.silent) return new FakeGuest(dir, null, null);
    const bin = join(REPO_DIR, "guest/agent/forkd-agent");
    if (!existsSync(bin)) execFileSync("make", ["-s", "-C", join(REPO_DIR, "guest/agent")]);
    const port = join(dir, "port.sock");
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, resolve);
    });
    const python = o.python
      ? ["--python", "/usr/bin/python3", "--evalsrv", join(REPO_DIR, "guest/evalsrv/forkd_eval.py")]
      : ["--python", "/nonexistent"];
    const argv = [bin, "--port", port, "--no-init", ...python];
    // Killed with the test process, should it die before close(): no agent outlives its test.
    const [cmd, ...args] = existsSync(SETPRIV) ? [SETPRIV, "--pdeathsig", "KILL", ...argv] : argv;
    const proc = spawn(cmd!, args, { stdio: "ignore", cwd: dir });
    proc.on("error", () => undefined);
    return new FakeGuest(dir, server, proc);
  }

  get connected(): boolean {
    return this.light ? !this.dead : this.conn !== null;
  }

  /** Sends bytes to the agent; false when it is not connected (the caller keeps them). */
  write(b: Buffer): boolean {
    if (this.light) {
      if (this.dead) return false;
      const replies = this.light.push(b);
      const gen = this.generation;
      if (replies.length) setImmediate(() => gen === this.generation && this.reply(replies));
      return true;
    }
    if (!this.conn) return false;
    this.conn.write(b);
    return true;
  }

  /** A light guest's replies, once it runs. */
  private reply(replies: Buffer[]): void {
    if (this.dead) return;
    if (this.frozen) this.held.push(...replies);
    else for (const r of replies) this.emit("data", r);
  }

  /** The host end of its port closed: the agent sees the hang-up and connects again. */
  hangup(): void {
    if (this.light) {
      this.light.reset();
      this.generation++;
      this.held = [];
      setImmediate(() => !this.dead && this.emit("connected"));
      return;
    }
    this.conn?.destroy();
    this.conn = null;
  }

  freeze(): void {
    this.frozen = true;
    this.signal("SIGSTOP");
  }

  thaw(): void {
    this.frozen = false;
    if (this.light) this.reply(this.held.splice(0));
    this.signal("SIGCONT");
  }

  private signal(sig: NodeJS.Signals): void {
    if (this.dead || !this.proc?.pid) return;
    try {
      process.kill(this.proc.pid, sig);
    } catch {
      /* gone */
    }
  }

  async kill(): Promise<void> {
    if (this.dead) return;
    this.dead = true;
    this.conn?.destroy();
    this.conn = null;
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      const gone = new Promise((r) => this.proc?.once("exit", r));
      this.proc.kill("SIGKILL");
      await gone;
    }
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    if (!this.light) await rm(this.dir, { recursive: true, force: true });
  }
}
