/**
 * E2B-protocol benchmark (issue 14): a command's round trip through E2B's envd protocol (the
 * unmodified npm `e2b` SDK's `commands.run`, Connect RPC on FORKD_E2B_LISTEN) against the same
 * command through forkd's own REST API (`POST /v1/sandboxes/:id/exec` on FORKD_LISTEN), in the
 * same sandbox, both over loopback TCP, interleaved; and an E2B `Sandbox.create` against forkd's
 * own fork, interleaved. Medians and ratios from this one run.
 *
 *   node dist/bench/e2b.js [--samples 30] [--creates 5] [--memory-mib 512] [--json-out FILE]
 */
import { randomBytes } from "node:crypto";
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { promisify } from "node:util";
import { Sandbox } from "e2b";
import { REPO_DIR } from "../src/host/paths.js";
import { startDaemon } from "./daemon.js";

const { values: args } = parseArgs({
  options: {
    samples: { type: "string", default: "30" },
    creates: { type: "string", default: "5" },
    "memory-mib": { type: "string", default: "512" },
    "json-out": { type: "string" },
  },
});
const SAMPLES = Number(args.samples);
const CREATES = Number(args.creates);
const MEMORY_MIB = Number(args["memory-mib"]);

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length === 0 ? NaN : s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const r1 = (x: number) => Math.round(x * 10) / 10;
const r2 = (x: number) => Math.round(x * 100) / 100;
const log = (s: string) => process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${s}\n`);

async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const a = srv.address();
      srv.close(() => (typeof a === "object" && a ? resolve(a.port) : reject(new Error("no port"))));
    });
  });
}

async function main(): Promise<void> {
  const dataDir = await mkdtemp(join(tmpdir(), "forkd-bench-e2b-"));
  const restPort = await freePort();
  const e2bPort = await freePort();
  const admin = randomBytes(24).toString("hex");
  const d = await startDaemon(dataDir, {
    FORKD_LISTEN: `127.0.0.1:${restPort}`,
    FORKD_E2B_LISTEN: `127.0.0.1:${e2bPort}`,
    FORKD_TOKEN: admin,
  });
  try {
    const cli = join(REPO_DIR, "dist/src/cli/main.js");
    const env = { ...process.env, FORKD_DATA_DIR: dataDir };
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [cli, "token", "create", "--tenant", "bench", "--e2b"],
      { env },
    );
    const apiKey = /e2b_[0-9a-f]+/.exec(stdout)?.[0];
    if (!apiKey) throw new Error(`no e2b key in: ${stdout}`);
    const opts = {
      apiKey,
      apiUrl: `http://127.0.0.1:${e2bPort}`,
      sandboxUrl: `http://127.0.0.1:${e2bPort}`,
    };
    log("snapshot bench (python template)");
    await d.api("POST", "/v1/snapshots", { tag: "bench", template: "python", memory_mib: MEMORY_MIB });

    const rest = async <T>(method: string, path: string, body?: unknown): Promise<T> => {
      const r = await fetch(`http://127.0.0.1:${restPort}${path}`, {
        method,
        headers: { authorization: `Bearer ${admin}`, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
      return (await r.json()) as T;
    };

    // Sandbox creation: E2B's Sandbox.create vs forkd's fork (+ kill outside the timing), interleaved.
    const e2bCreate: number[] = [];
    const forkdCreate: number[] = [];
    for (let i = 0; i < CREATES; i++) {
      let t0 = performance.now();
      const s = await Sandbox.create("bench", opts);
      e2bCreate.push(performance.now() - t0);
      await s.kill();
      t0 = performance.now();
      const f = await rest<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", {
        snapshot_tag: "bench",
      });
      forkdCreate.push(performance.now() - t0);
      await rest("DELETE", `/v1/sandboxes/${f.sandboxes[0]!.id}`);
    }

    // Command round trips in one sandbox: `true`, then `echo` of 64 KiB, interleaved.
    const sbx = await Sandbox.create("bench", opts);
    const id = sbx.sandboxId;
    const rows: { what: string; e2b: number[]; forkd: number[] }[] = [
      { what: "true", e2b: [], forkd: [] },
      { what: "head -c 65536 /dev/zero | base64 -w0", e2b: [], forkd: [] },
    ];
    for (const row of rows) {
      for (let i = 0; i < 3; i++) {
        await sbx.commands.run(row.what, { user: "root" });
        await rest("POST", `/v1/sandboxes/${id}/exec`, { cmd: row.what });
      }
      for (let i = 0; i < SAMPLES; i++) {
        let t0 = performance.now();
        const a = await sbx.commands.run(row.what, { user: "root" });
        row.e2b.push(performance.now() - t0);
        t0 = performance.now();
        const b = await rest<{ stdout: string }>("POST", `/v1/sandboxes/${id}/exec`, { cmd: row.what });
        row.forkd.push(performance.now() - t0);
        if (a.stdout !== b.stdout) throw new Error(`outputs differ for ${row.what}`);
      }
    }
    await sbx.kill();

    const table = [
      "| what | E2B protocol (e2b SDK) | forkd REST | ratio |",
      "|---|---|---|---|",
      `| sandbox create, ${CREATES} each | ${r1(median(e2bCreate))} ms | ${r1(median(forkdCreate))} ms | ${r2(median(e2bCreate) / median(forkdCreate))}x |`,
      ...rows.map(
        (r) =>
          `| \`${r.what}\` round trip, ${SAMPLES} each | ${r1(median(r.e2b))} ms | ${r1(median(r.forkd))} ms | ${r2(median(r.e2b) / median(r.forkd))}x |`,
      ),
    ];
    process.stdout.write(table.join("\n") + "\n");
    if (args["json-out"]) {
      await writeFile(
        args["json-out"],
        JSON.stringify({ e2bCreate, forkdCreate, rows, memoryMiB: MEMORY_MIB }, null, 2) + "\n",
      );
    }
  } finally {
    await d.stop();
    await rm(dataDir, { recursive: true, force: true });
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
