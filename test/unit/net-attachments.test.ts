/**
 * The three attachment kinds (src/net/attachments/): what each gives its VMM, what its record
 * says, how exposed ports and egress change, and what release gives back. Slotted ones against
 * a fake slot pool (no root needed); relays listen on 127.0.0.1 for real.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "node:net";
import type { Attachment, HostForwarder, NetworkRecord } from "../../src/net/attachments/attachment.js";
import { NoneAttachment } from "../../src/net/attachments/none.js";
import { nsUse, SlottedAttachment } from "../../src/net/attachments/slotted.js";
import type { SlotHost, SlotLeases } from "../../src/net/attachments/slotted.js";
import { UserAttachment } from "../../src/net/attachments/user.js";
import { freePort } from "../../src/net/expose.js";
import type { PortRelay } from "../../src/net/expose.js";
import type { Egress, NetworkSpec } from "../../src/net/policy.js";
import { instanceOf, slotOf } from "../../src/net/slots.js";
import { ForkdError } from "../../src/util/errors.js";

const isCode = (code: string) => (e: unknown) => e instanceof ForkdError && e.code === code;
const DENY: Egress = { mode: "deny", allow: [], dns: false };
const ALLOW: Egress = { mode: "allow", allow: [], dns: true };
const ADDR = "127.0.0.1";

/** A VMM's hostfwd that records the rules it is given. */
function forwarder(): HostForwarder & { rules: string[] } {
  const rules: string[] = [];
  return {
    rules,
    hostfwdAdd: async (r) => void rules.push(`+${r}`),
    hostfwdRemove: async (r) => void rules.push(`-${r}`),
  };
}

/** Whether something accepts TCP connections at addr:port. */
const listening = (hostPort: string) =>
  new Promise<boolean>((resolve) => {
    const [host, port] = hostPort.split(":");
    const s = connect({ host: host!, port: Number(port) });
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("error", () => resolve(false));
  });

test("none: link down, holds nothing, refuses ports and egress", async () => {
  const a: Attachment = new NoneAttachment();
  assert.deepEqual(a.backend, { kind: "none" });
  assert.equal(a.linkUp, false);
  assert.equal(a.netns, undefined);
  assert.equal(a.record().mode, "none");
  assert.equal(a.record().guestIp, null);
  await a.start();
  await assert.rejects(a.expose(8080, forwarder()), isCode("invalid_argument"));
  await a.unexpose(8080, forwarder());
  await assert.rejects(a.setEgress(ALLOW), isCode("invalid_argument"));
  await a.release();
  await a.release();
});

test("user: slirp forwards its exposed ports itself, on the ports it had where free", async () => {
  const spec: NetworkSpec = { mode: "user", egress: DENY, expose: [80, 443] };
  const had = await freePort(ADDR);
  const prior: NetworkRecord = {
    ...spec,
    guestIp: "10.0.2.15",
    slot: null,
    ports: { "80": `${ADDR}:${had}` },
  };
  const a: Attachment = await UserAttachment.create(spec, "10.0.2.15", "/usr/bin/qemu-slirp", ADDR, prior);
  assert.equal(a.linkUp, true);
  assert.equal(a.binary, "/usr/bin/qemu-slirp");
  assert.equal(a.netns, undefined);
  assert.equal(a.backend.kind, "user");
  const backend = a.backend;
  assert.equal(backend.restrict, true, "egress deny: restrict=on");
  assert.deepEqual(
    backend.forwards.map((f) => f.guestPort),
    [80, 443],
  );
  const r = a.record();
  assert.equal(r.ports["80"], `${ADDR}:${had}`, "the port it had before its pause");
  assert.match(r.ports["443"] ?? "", /^127\.0\.0\.1:\d+$/);
  assert.equal(r.slot, null);
  r.expose.push(1); // a copy
  assert.deepEqual(a.record().expose, [80, 443]);

  const vmm = forwarder();
  await Promise.all([a.expose(8080, vmm), a.expose(8080, vmm)]); // one at a time: one forward
  assert.equal(vmm.rules.length, 1);
  const at = a.record().ports["8080"];
  assert.equal(vmm.rules[0], `+tcp:${at}-10.0.2.15:8080`);
  await a.unexpose(8080, vmm);
  await a.unexpose(8080, vmm);
  assert.deepEqual(vmm.rules.slice(1), [`-tcp:${at}`]);
  assert.deepEqual(a.record().expose, [80, 443]);
  assert.equal(a.record().ports["8080"], undefined);
  await assert.rejects(a.setEgress(ALLOW), isCode("conflict"));
});

test("user: an adopted child keeps its record and its own forwards", async () => {
  const r: NetworkRecord = {
    mode: "user",
    egress: DENY,
    expose: [80],
    guestIp: "10.0.2.15",
    slot: null,
    ports: { "80": `${ADDR}:1234` },
  };
  const a: Attachment = UserAttachment.adopt(r, ADDR);
  assert.deepEqual(a.backend, { kind: "none" });
  assert.deepEqual(a.record(), r);
  assert.notEqual(a.record().ports, r.ports);
});

/** A slot pool that records what it is asked. */
function fakePool(): SlotLeases & { calls: string[] } {
  const inst = instanceOf("abcd", 8, {});
  const calls: string[] = [];
  return {
    calls,
    acquire: async (use) => (
      calls.push(`acquire ${use.egress.mode} ${use.ns.backend} ${use.ns.expose.join()}`),
      slotOf(inst, 3)
    ),
    adopt: (index, use) => void calls.push(`adopt ${index} ${use.ns.backend} ${use.ns.expose.join()}`),
    release: (index) => void calls.push(`release ${index}`),
    setNs: async (index, ns) => void calls.push(`setNs ${index} ${ns.backend} ${ns.expose.join()}`),
    setPolicy: async (index, e) => void calls.push(`setPolicy ${index} ${e.mode}`),
  };
}

const hostOf = (pool: SlotLeases): SlotHost => ({
  pool,
  exposeAddr: ADDR,
  resolver: "10.0.0.53",
  relays: new Set<PortRelay>(),
});

test("slotted: a tap in the slot, a relay per exposed port, the slot back on release", async () => {
  const pool = fakePool();
  const host = hostOf(pool);
  const spec: NetworkSpec = { mode: "netns", egress: ALLOW, expose: [80] };
  const a = await SlottedAttachment.acquire(host, spec, "10.0.2.15", "/usr/bin/qemu-slirp", undefined);
  assert.deepEqual(a.backend, { kind: "tap", ifname: "tap0" });
  assert.equal(a.binary, undefined, "a tap needs no slirp build");
  assert.equal(a.netns, "/run/netns/forkd-abcd-3");
  assert.deepEqual(pool.calls, ["acquire allow tap 80"]);
  await a.start();
  const at80 = a.record().ports["80"]!;
  assert.equal(host.relays.size, 1);
  assert.ok(await listening(at80));

  const vmm = forwarder();
  await a.expose(8080, vmm);
  assert.deepEqual(vmm.rules, [], "a tap's guest is DNATed in the slot: no hostfwd");
  assert.deepEqual(pool.calls.slice(1), ["setNs 3 tap 80,8080"]);
  assert.deepEqual(a.record().expose, [80, 8080]);
  await a.setEgress(DENY);
  assert.equal(a.record().egress.mode, "deny");
  await a.unexpose(8080, vmm);
  assert.deepEqual(pool.calls.slice(2), ["setPolicy 3 deny", "setNs 3 tap 80"]);
  assert.equal(a.record().slot, 3);

  await a.release();
  await a.release();
  assert.deepEqual(pool.calls.slice(4), ["release 3"], "released once");
  assert.equal(a.record().slot, null);
  assert.equal(host.relays.size, 0);
  assert.equal(await listening(at80), false, "its relay is closed");
  await assert.rejects(a.expose(9090, vmm), isCode("conflict"));
  await assert.rejects(a.setEgress(ALLOW), isCode("conflict"));
});

test("slotted: slirp in a slot forwards from the slot's address; no ports: the free slot's table", async () => {
  const pool = fakePool();
  const host = hostOf(pool);
  const a = await SlottedAttachment.acquire(
    host,
    { mode: "user", egress: ALLOW, expose: [] },
    "10.0.2.15",
    "/q",
    undefined,
  );
  assert.deepEqual(a.backend, { kind: "user", restrict: false, forwards: [] });
  assert.equal(a.binary, "/q");
  assert.deepEqual(pool.calls, ["acquire allow tap "], "slirp without ports: the free slot's table");
  const vmm = forwarder();
  await a.expose(8080, vmm);
  const nsAddr = slotOf(instanceOf("abcd", 8, {}), 3).nsAddr;
  assert.deepEqual(vmm.rules, [`+tcp:${nsAddr}:8080-10.0.2.15:8080`]);
  assert.deepEqual(pool.calls.slice(1), ["setNs 3 user 8080"]);
  await a.unexpose(8080, vmm);
  assert.deepEqual(vmm.rules.slice(1), [`-tcp:${nsAddr}:8080`]);
  await a.release();
  assert.deepEqual(nsUse(host, false, [1]), { backend: "user", dnsTo: "10.0.0.53", expose: [1] });
});

test("slotted: an adopted child marks its slot busy again and relays from the ports it had", async () => {
  const pool = fakePool();
  const host = hostOf(pool);
  const had = await freePort(ADDR);
  const r: NetworkRecord = {
    mode: "user",
    egress: ALLOW,
    expose: [80],
    guestIp: "10.0.2.15",
    slot: 3,
    ports: { "80": `${ADDR}:${had}` },
  };
  const a = SlottedAttachment.adopt(host, slotOf(instanceOf("abcd", 8, {}), 3), r);
  assert.deepEqual(pool.calls, ["adopt 3 user 80"]);
  assert.deepEqual(a.backend, { kind: "none" }, "its VMM runs already");
  await a.start();
  assert.deepEqual(a.record(), r);
  await a.release();
});
