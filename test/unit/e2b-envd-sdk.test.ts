/**
 * envd's wire against E2B's unmodified npm SDK (commands, files) and a Connect client in both
 * encodings, over a host stand-in for the guest agent (test/helpers/envd-host.ts).
 */
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Sandbox, CommandExitError, NotFoundError } from "e2b";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Process } from "../../src/e2b/envd/gen/process/process_pb.js";
import { Filesystem, FileType } from "../../src/e2b/envd/gen/filesystem/filesystem_pb.js";
import { HOST_CREDENTIAL, SANDBOX_ID, envdHost } from "../helpers/envd-host.js";
import type { EnvdHost } from "../helpers/envd-host.js";

let host: EnvdHost;
let sbx: Sandbox;

const waitFor = async (ok: () => boolean, ms = 5000) => {
  const t0 = Date.now();
  while (!ok()) {
    if (Date.now() - t0 > ms) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 20));
  }
};

before(async () => {
  host = await envdHost();
  const Ctor = Sandbox as unknown as new (o: Record<string, unknown>) => Sandbox;
  sbx = new Ctor({ sandboxId: SANDBOX_ID, envdVersion: "0.6.4", sandboxUrl: host.url, apiKey: "e2b_00" });
});
after(async () => host.close());

test("commands.run: stdout and stderr streamed to callbacks, envs, cwd relative to the home", async () => {
  const timed = host.metrics.exec.length;
  const out: string[] = [];
  const err: string[] = [];
  const r = await sbx.commands.run('echo "$GREETING"; echo oops >&2; pwd', {
    envs: { GREETING: "hello" },
    cwd: ".",
    onStdout: (d) => void out.push(d),
    onStderr: (d) => void err.push(d),
  });
  assert.equal(r.exitCode, 0);
  assert.equal(r.stdout, `hello\n${host.home}\n`);
  assert.equal(out.join(""), r.stdout);
  assert.equal(err.join(""), "oops\n");
  // Its latency is in forkd_exec_seconds, as a REST exec's is (src/app/exec.ts).
  await waitFor(() => host.metrics.exec.length === timed + 1);
  assert.deepEqual(host.metrics.failures, []);
});

test("commands.run: a non-zero exit is a CommandExitError with its code and output", async () => {
  await assert.rejects(sbx.commands.run("echo partial; exit 3"), (e: unknown) => {
    assert.ok(e instanceof CommandExitError);
    assert.equal(e.exitCode, 3);
    assert.equal(e.stdout, "partial\n");
    assert.equal(e.error, "exit status 3");
    return true;
  });
});

test("background command: list, stdin, connect from a second handle, kill", async () => {
  const h = await sbx.commands.run("cat", { background: true, stdin: true });
  assert.ok(h.pid > 0);
  const listed = await sbx.commands.list();
  assert.ok(listed.some((p) => p.pid === h.pid && p.args.includes("cat")));
  const other = await sbx.commands.connect(h.pid);
  await sbx.commands.sendStdin(h.pid, "echoed\n");
  await waitFor(() => other.stdout.includes("echoed") && h.stdout.includes("echoed"));
  assert.equal(await sbx.commands.kill(h.pid), true);
  await assert.rejects(h.wait(), CommandExitError);
  await assert.rejects(other.wait(), CommandExitError);
  assert.equal(await sbx.commands.kill(h.pid), false, "a process that is gone is not found");
});

test("a command forkd's own API started: listed (with its envs), connected to and killed through envd", async () => {
  const line = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.05; done";
  const pid = await host.startTracked(line, { MODE: "rest" });
  const listed = (await sbx.commands.list()).find((p) => p.pid === pid);
  assert.ok(listed, "listed");
  assert.equal(listed.cmd, "/bin/sh");
  assert.deepEqual(listed.args, ["-c", line]);
  assert.deepEqual(listed.envs, { MODE: "rest" });
  assert.equal(listed.tag, undefined);
  const h = await sbx.commands.connect(pid, { timeoutMs: 0 });
  await waitFor(() => /tick \d+\n/.test(h.stdout));
  assert.equal(await sbx.commands.kill(pid), true);
  await assert.rejects(h.wait(), CommandExitError);
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === pid));
});

test("a process started through envd is one of the sandbox's commands: listed, signalled by the registry", async () => {
  const h = await sbx.commands.run("sleep 30", { background: true, envs: { MODE: "envd" }, cwd: "/tmp" });
  const c = host.commands.get(h.pid);
  assert.equal(c.door, "envd");
  assert.deepEqual(c.cmd, ["/bin/bash", "-l", "-c", "sleep 30"]);
  assert.deepEqual(c.env, { MODE: "envd" });
  assert.equal(c.cwd, "/tmp");
  host.commands.signal(h.pid, 15);
  await assert.rejects(
    h.wait(),
    (e: unknown) => e instanceof CommandExitError && /terminated/.test(e.error ?? ""),
  );
  assert.equal(host.commands.history().at(-1)?.pid, h.pid);
});

test("a process whose stream's client hung up keeps running; the stream's lease is freed", async () => {
  const h = await sbx.commands.run("sleep 30", { background: true });
  await h.disconnect();
  await new Promise((r) => setTimeout(r, 200));
  assert.ok(
    (await sbx.commands.list()).some((p) => p.pid === h.pid),
    "still running after the hang-up",
  );
  assert.equal(await sbx.commands.kill(h.pid), true);
  await waitFor(() => host.leased() === 0);
});

test("files: write and read text and bytes, info, list, exists, rename, makeDir, remove", async () => {
  const w = await sbx.files.write("notes/a.txt", "hi there");
  assert.equal(w.path, `${host.home}/notes/a.txt`);
  assert.equal(await sbx.files.read("notes/a.txt"), "hi there");
  const bytes = new Uint8Array([0, 1, 2, 255]);
  await sbx.files.write(`${host.home}/b.bin`, bytes.buffer);
  assert.deepEqual(await sbx.files.read("b.bin", { format: "bytes" }), bytes);
  const info = await sbx.files.getInfo("notes/a.txt");
  assert.equal(info.type, "file");
  assert.equal(info.size, 8);
  assert.equal(info.name, "a.txt");
  assert.match(info.permissions, /^-rw/);
  assert.ok(info.modifiedTime instanceof Date);
  const list = await sbx.files.list(".");
  assert.deepEqual(list.map((e) => e.name).sort(), ["b.bin", "notes"]);
  assert.equal((await sbx.files.list(".", { depth: 2 })).length, 3);
  assert.equal(await sbx.files.exists("nope.txt"), false);
  assert.equal(await sbx.files.makeDir("d/e"), true);
  assert.equal(await sbx.files.makeDir("d/e"), false, "an existing directory is not made again");
  const moved = await sbx.files.rename("notes/a.txt", "d/e/a.txt");
  assert.equal(moved.path, `${host.home}/d/e/a.txt`);
  await sbx.files.remove("d");
  assert.equal(await sbx.files.exists("d/e/a.txt"), false);
  await assert.rejects(sbx.files.read("missing.txt"), NotFoundError);
  await assert.rejects(sbx.files.getInfo("missing.txt"), NotFoundError);
});

test("files: several at once (multipart) and gzip octet-stream", async () => {
  const many = await sbx.files.write([
    { path: "m/1.txt", data: "one" },
    { path: "m/2.txt", data: "two" },
  ]);
  assert.equal(many.length, 2);
  assert.equal(await sbx.files.read("m/2.txt"), "two");
  await sbx.files.write("z.txt", "zipped body", { gzip: true });
  assert.equal(await sbx.files.read("z.txt"), "zipped body");
});

for (const binary of [false, true]) {
  test(`Connect ${binary ? "binary" : "JSON"} encoding: a streamed Start and a unary Stat`, async () => {
    const transport = createConnectTransport({
      baseUrl: host.url,
      httpVersion: "1.1",
      useBinaryFormat: binary,
    });
    const proc = createClient(Process, transport);
    const events: string[] = [];
    let data = "";
    for await (const r of proc.start({
      process: { cmd: "/bin/sh", args: ["-c", "printf abc; exit 2"], envs: {} },
    })) {
      const ev = r.event?.event;
      events.push(ev?.case ?? "none");
      if (ev?.case === "data" && ev.value.output.case === "stdout")
        data += Buffer.from(ev.value.output.value).toString();
      if (ev?.case === "end") {
        assert.equal(ev.value.exitCode, 2);
        assert.equal(ev.value.exited, true);
        assert.equal(ev.value.status, "exit status 2");
      }
    }
    assert.equal(events[0], "start");
    assert.equal(events.at(-1), "end");
    assert.equal(data, "abc");
    const fs = createClient(Filesystem, transport);
    const st = await fs.stat({ path: host.home });
    assert.equal(st.entry?.type, FileType.DIRECTORY);
  });
}

/** Bytes that are no protobuf message: field 1 of wire type 7 (there is none), then junk. */
const NOT_PROTOBUF = Buffer.from([0x0f, 0xff, 0xff, 0xff]);
const envelope = (flags: number, data: Buffer) => {
  const h = Buffer.alloc(5);
  h[0] = flags;
  h.writeUInt32BE(data.length, 1);
  return Buffer.concat([h, data]);
};

test("a malformed binary Connect body is invalid_argument (400), not internal", async () => {
  // Unary (application/proto): HTTP 400 with Connect's JSON error.
  const unary = await fetch(`${host.url}/filesystem.Filesystem/Stat`, {
    method: "POST",
    headers: { "content-type": "application/proto", "connect-protocol-version": "1" },
    body: NOT_PROTOBUF,
  });
  assert.equal(unary.status, 400);
  assert.equal(((await unary.json()) as { code: string }).code, "invalid_argument");
  // Server streaming (application/connect+proto): the end of stream names invalid_argument.
  const streamed = await fetch(`${host.url}/process.Process/Start`, {
    method: "POST",
    headers: { "content-type": "application/connect+proto", "connect-protocol-version": "1" },
    body: envelope(0, NOT_PROTOBUF),
  });
  assert.equal(streamed.status, 200);
  const bytes = Buffer.from(await streamed.arrayBuffer());
  assert.equal(bytes[0], 0x02, "an end-of-stream envelope");
  const end = JSON.parse(bytes.subarray(5, 5 + bytes.readUInt32BE(1)).toString()) as {
    error?: { code: string };
  };
  assert.equal(end.error?.code, "invalid_argument");
  // gRPC-web: its trailer says status 3 (INVALID_ARGUMENT).
  const web = await fetch(`${host.url}/filesystem.Filesystem/Stat`, {
    method: "POST",
    headers: { "content-type": "application/grpc-web+proto", "x-grpc-web": "1" },
    body: envelope(0, NOT_PROTOBUF),
  });
  const webBytes = Buffer.from(await web.arrayBuffer());
  const status =
    web.headers.get("grpc-status") ?? /grpc-status: ?(\d+)/.exec(webBytes.toString("latin1"))?.[1];
  assert.equal(status, "3");
  // A well-formed binary message on the same routes still works.
  const ok = await fetch(`${host.url}/filesystem.Filesystem/Stat`, {
    method: "POST",
    headers: { "content-type": "application/proto", "connect-protocol-version": "1" },
    body: Buffer.concat([Buffer.from([0x0a, host.home.length]), Buffer.from(host.home)]),
  });
  assert.equal(ok.status, 200);
  assert.equal(ok.headers.get("content-type"), "application/proto");
});

test("watchDir (streamed) and the polling watchers see a new file", async () => {
  await sbx.files.makeDir("w");
  const seen: string[] = [];
  const h = await sbx.files.watchDir("w", (ev) => void seen.push(`${ev.type}:${ev.name}`));
  const transport = createConnectTransport({ baseUrl: host.url, httpVersion: "1.1" });
  const fs = createClient(Filesystem, transport);
  const { watcherId } = await fs.createWatcher({ path: "w" });
  await sbx.files.write("w/new.txt", "x");
  await waitFor(() => seen.some((x) => x.endsWith(":new.txt")));
  let polled: string[] = [];
  for (let i = 0; i < 50 && polled.length === 0; i++) {
    polled = (await fs.getWatcherEvents({ watcherId })).events.map((x) => x.name);
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(polled.includes("new.txt"), polled.join(","));
  await fs.removeWatcher({ watcherId });
  await assert.rejects(fs.getWatcherEvents({ watcherId }), /not found/);
  await h.stop();
  await waitFor(() => host.leased() === 0);
});

test("a polling watcher is removed (its lease released) when the credential that made it is revoked", async () => {
  await sbx.files.makeDir("rw");
  const fs = createClient(Filesystem, createConnectTransport({ baseUrl: host.url, httpVersion: "1.1" }));
  const leased = host.leased();
  const { watcherId } = await fs.createWatcher({ path: "rw" });
  assert.equal(host.leased(), leased + 1);
  assert.equal(host.opened.revoke(HOST_CREDENTIAL), 1);
  assert.equal(host.leased(), leased, "its lease released");
  await assert.rejects(fs.getWatcherEvents({ watcherId }), /not found/);
  // One removed by its client is no longer registered.
  const again = await fs.createWatcher({ path: "rw" });
  await fs.removeWatcher({ watcherId: again.watcherId });
  assert.equal(host.opened.count(HOST_CREDENTIAL), 0);
});

test("StreamInput (client streaming over HTTP/1.1) feeds a process's stdin; keepalives while idle", async () => {
  const transport = createConnectTransport({ baseUrl: host.url, httpVersion: "1.1" });
  const proc = createClient(Process, transport);
  const stream = proc.start(
    { process: { cmd: "/bin/sh", args: ["-c", "sleep 1.5; cat"], envs: {} }, stdin: true, tag: "feeder" },
    { headers: { "keepalive-ping-interval": "1" } },
  );
  const it = stream[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.done, false);
  if (!first.done) assert.equal(first.value.event?.event.case, "start");
  async function* input() {
    yield {
      event: {
        case: "start" as const,
        value: { process: { selector: { case: "tag" as const, value: "feeder" } } },
      },
    };
    yield {
      event: {
        case: "data" as const,
        value: { input: { input: { case: "stdin" as const, value: new TextEncoder().encode("fed\n") } } },
      },
    };
  }
  await proc.streamInput(input());
  await proc.closeStdin({ process: { selector: { case: "tag", value: "feeder" } } });
  const cases: string[] = [];
  let out = "";
  for (let n = await it.next(); !n.done; n = await it.next()) {
    const ev = n.value.event?.event;
    cases.push(ev?.case ?? "none");
    if (ev?.case === "data" && ev.value.output.case === "stdout")
      out += Buffer.from(ev.value.output.value).toString();
  }
  assert.equal(out, "fed\n");
  assert.ok(cases.includes("keepalive"), cases.join(","));
  assert.equal(cases.at(-1), "end");
});
