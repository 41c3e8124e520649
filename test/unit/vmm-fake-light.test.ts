/**
 * The fake VMM's light guests (FakeHost({light: true}): test/fakes/guest.ts, light-agent.ts),
 * which the cluster scale benchmark runs by the thousand: no agent process and no directory; the
 * handover, PING, SYNC and IDENTITY answered as the real agent answers them; a paused guest
 * answers nothing until it resumes; everything else refused with ENOSYS. The default host's
 * guests are untouched (test/unit/vmm-fake.test.ts runs the VMM contract on them).
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { ForkdError } from "../../src/util/errors.js";
import { FakeHost } from "../fakes/vmm.js";

const dir = await mkdtemp(join(tmpdir(), "forkd-fakevmm-light-"));
const host = new FakeHost({ light: true });
const machine = { memoryMiB: 128, vcpus: 1, accel: "tcg" as const, cpu: "qemu64" };

after(async () => {
  await host.close();
  await rm(dir, { recursive: true, force: true });
});

const guestDirs = async () =>
  (await readdir(tmpdir())).filter((n) => n.startsWith("forkd-fake-guest-")).length;

test("light guest: answers PING, SYNC and IDENTITY in this process; refuses a command with ENOSYS", async () => {
  const d = join(dir, "a");
  await mkdir(d);
  await writeFile(join(d, "disk"), "");
  const dirsBefore = await guestDirs();
  const vm = await host
    .driver()
    .launch({ dir: d, machine, memory: { path: join(d, "memory"), mode: "parent" }, disk: join(d, "disk") });
  assert.equal(await guestDirs(), dirsBefore, "no guest directory, no agent process");
  const agent = await vm.connectAgent(1_000);
  const p = await agent.ping(2_000);
  assert.deepEqual(p, { version: 1, uptimeMs: p.uptimeMs, evalReady: false, kernels: [], features: [] });
  await agent.sync(2_000);
  await agent.identity({ hostname: "h", sandboxId: "sb-abcdefghijklmnop" }, 2_000);
  assert.deepEqual(host.process(vm.pid)?.guest?.identities, [
    { hostname: "h", sandboxId: "sb-abcdefghijklmnop" },
  ]);
  const run = agent.exec({ argv: ["true"], startTimeoutMs: 2_000 });
  await assert.rejects(run.result, (e: unknown) => e instanceof ForkdError && e.details.errno === 38);
  await assert.rejects(
    agent.readFile("/etc/hostname", { timeoutMs: 2_000 }),
    (e: unknown) => e instanceof ForkdError,
  );
  assert.equal((await agent.ping(2_000)).version, 1, "it still answers after a refusal");
  agent.close();
  await vm.kill();
});

test("light guest: a child restored from state answers once resumed, not while paused; a new connection is served", async () => {
  const d = join(dir, "b");
  await mkdir(d);
  await writeFile(join(d, "disk"), "");
  await writeFile(join(d, "memory"), Buffer.alloc(4096));
  await writeFile(join(d, "state"), "another VMM's device state");
  const vm = await host.driver().launch({
    dir: d,
    machine,
    memory: { path: join(d, "memory"), mode: "child" },
    disk: join(d, "disk"),
    incoming: true,
  });
  const agent = await vm.connectAgent(1_000);
  await vm.restoreState(join(d, "state"));
  assert.equal(await vm.status(), "paused");
  let answered = false;
  const ping = agent.ping(5_000).then((r) => {
    answered = true;
    return r;
  });
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(answered, false, "a paused guest answers nothing");
  await vm.resume();
  assert.equal((await ping).version, 1);
  agent.close();
  const again = await vm.connectAgent(1_000);
  assert.equal((await again.ping(2_000)).version, 1);
  again.close();
  await vm.kill();
});
