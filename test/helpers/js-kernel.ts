/**
 * The guest's JavaScript kernel (guest/evalsrv/forkd_eval.js) run on the host, spoken to in its
 * framed protocol (docs/agent-protocol.md, "Agent to interpreter") as forkd-agent speaks to it:
 * over real pipes (FIFOs, so the kernel takes the path it takes in the guest), or over the
 * socketpairs Node's spawn() makes.
 */
import { execFileSync, spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { closeSync, constants, openSync, writeSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Readable } from "node:stream";
import type { EvalResult } from "../../src/agent/eval.js";
import { REPO_DIR } from "../../src/host/paths.js";

export const JS_KERNEL = join(REPO_DIR, "guest/evalsrv/forkd_eval.js");
/** The node that runs the kernel: FORKD_TEST_KERNEL_NODE (e.g. Debian's Node 18), else this one. */
const NODE = process.env.FORKD_TEST_KERNEL_NODE ?? process.execPath;

export interface KernelReply {
  id: number;
  /** Encoded size of the JSON (what the agent must fit in one frame). */
  bytes: number;
  result: EvalResult;
}

export class JsKernelProcess {
  private buf = Buffer.alloc(0);
  private waiting: ((r: KernelReply) => void)[] = [];
  private replies: KernelReply[] = [];
  stderr = "";
  private constructor(
    readonly child: ChildProcess,
    private readonly send: (frame: Buffer) => void,
    input: Readable,
    private readonly cleanup: () => Promise<void>,
  ) {
    input.on("data", (chunk: Buffer) => this.onData(chunk));
    child.stderr?.on("data", (c: Buffer) => (this.stderr += c.toString()));
  }

  /** Starts `node script`; `pipes` (default) gives it FIFOs, else spawn()'s socketpairs. */
  static async start(o: { script?: string; pipes?: boolean } = {}): Promise<JsKernelProcess> {
    const script = o.script ?? JS_KERNEL;
    if (o.pipes === false) {
      const child = spawn(NODE, [script], { stdio: ["pipe", "pipe", "pipe"] });
      return new JsKernelProcess(
        child,
        (f) => child.stdin?.write(f),
        child.stdout,
        async () => {},
      );
    }
    const dir = await mkdtemp(join(tmpdir(), "forkd-jsk-"));
    const [inPath, outPath] = [join(dir, "in"), join(dir, "out")];
    execFileSync("mkfifo", [inPath, outPath]);
    // O_RDWR: neither open blocks waiting for the other end
    const inFd = openSync(inPath, constants.O_RDWR);
    const outFd = openSync(outPath, constants.O_RDWR | constants.O_NONBLOCK);
    const child = spawn(NODE, [script], { stdio: [inFd, outFd, "pipe"] });
    const reader = new Socket({ fd: outFd, readable: true, writable: false });
    return new JsKernelProcess(
      child,
      (f) => {
        for (let off = 0; off < f.length;) off += writeSync(inFd, f, off);
      },
      reader,
      async () => {
        reader.destroy();
        closeSync(inFd);
        await rm(dir, { recursive: true, force: true });
      },
    );
  }

  private onData(chunk: Buffer): void {
    this.buf = Buffer.concat([this.buf, chunk]);
    while (this.buf.length >= 8) {
      const len = this.buf.readUInt32BE(0);
      if (this.buf.length < 4 + len) return;
      const id = this.buf.readUInt32BE(4);
      const json = this.buf.subarray(8, 4 + len);
      this.buf = this.buf.subarray(4 + len);
      const reply = { id, bytes: json.length, result: JSON.parse(json.toString("utf8")) as EvalResult };
      const w = this.waiting.shift();
      if (w) w(reply);
      else this.replies.push(reply);
    }
  }

  /** Sends one request without waiting (as the agent does before a timeout). */
  request(code: string, id = 1): void {
    const body = Buffer.from(code, "utf8");
    const head = Buffer.alloc(8);
    head.writeUInt32BE(body.length + 4, 0);
    head.writeUInt32BE(id, 4);
    this.send(Buffer.concat([head, body]));
  }

  /** The next reply; rejects after timeoutMs or if the kernel exits. */
  next(timeoutMs = 20_000): Promise<KernelReply> {
    const ready = this.replies.shift();
    if (ready) return Promise.resolve(ready);
    if (this.child.exitCode !== null || this.child.signalCode !== null) {
      return Promise.reject(
        new Error(`kernel exited (${this.child.exitCode ?? this.child.signalCode}): ${this.stderr}`),
      );
    }
    return new Promise((resolve, reject) => {
      const onExit = (code: number | null) => {
        clearTimeout(timer);
        reject(new Error(`kernel exited (${code}): ${this.stderr}`));
      };
      const timer = setTimeout(() => {
        this.child.off("exit", onExit);
        reject(new Error(`no reply in ${timeoutMs} ms; stderr: ${this.stderr}`));
      }, timeoutMs);
      this.child.once("exit", onExit);
      this.waiting.push((r) => {
        clearTimeout(timer);
        this.child.off("exit", onExit);
        resolve(r);
      });
    });
  }

  async eval(code: string, id = 1): Promise<EvalResult> {
    this.request(code, id);
    const r = await this.next();
    if (r.id !== id) throw new Error(`reply id ${r.id}, expected ${id}`);
    return r.result;
  }

  async close(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const gone = new Promise((r) => this.child.once("exit", r));
      this.child.kill("SIGKILL");
      await gone;
    }
    await this.cleanup();
  }
}
