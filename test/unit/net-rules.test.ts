/**
 * Slot addressing and the nftables rules generated for each policy. When this runs as root with
 * nft installed, every generated script is also checked by nft itself (`nft -c`, nothing applied).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { GUEST_NET, guestNetArg, guestSubnet } from "../../src/net/guest.js";
import { hostTable, nsTable, slotPolicy, slotRules } from "../../src/net/nft.js";
import { parseHostAllow } from "../../src/net/host-access.js";
import { parseNetwork } from "../../src/net/policy.js";
import { instanceId, instanceOf, slotIndexOfNetns, slotOf } from "../../src/net/slots.js";
import { ForkdError } from "../../src/util/errors.js";
import { run } from "../../src/util/proc.js";
import { netdevArg, nicArg, qemuArgs } from "../../src/vmm/config.js";

const RESOLVER = "192.0.2.53";
/** No host destination opened (the default), and some opened by the operator. */
const CLOSED = { resolver: RESOLVER, hostOpen: false };
const OPENED = { resolver: RESOLVER, hostOpen: true };
const inst = instanceOf("ab12", 8, {});
const egress = (n: Parameters<typeof parseNetwork>[0]) => parseNetwork(n).egress;

async function nftChecks(script: string): Promise<boolean | string> {
  if (process.getuid?.() !== 0) return "not root";
  try {
    await run("nft", ["--version"]);
  } catch {
    return "no nft";
  }
  await run("nft", ["-c", "-f", "-"], { input: script });
  return true;
}

test("slots: names fit interface limits, addresses are one /30 each from the instance's block", () => {
  assert.match(instanceId("/var/lib/forkd", {}), /^[0-9a-f]{4}$/);
  assert.equal(instanceId("/x", { FORKD_NET_ID: "beef" }), "beef");
  assert.throws(() => instanceId("/x", { FORKD_NET_ID: "nope" }), ForkdError);
  const a = instanceOf("ab12", 256, {});
  assert.equal(a.prefix, 22);
  assert.equal(a.base % 1024, 0);
  const s0 = slotOf(a, 0);
  const last = slotOf(a, 255);
  assert.equal(s0.netns, "forkd-ab12-0");
  assert.equal(s0.netnsPath, "/run/netns/forkd-ab12-0");
  assert.ok(last.hostIf.length <= 15, last.hostIf);
  assert.equal(slotIndexOfNetns(a, "forkd-ab12-255"), 255);
  assert.equal(slotIndexOfNetns(a, "forkd-ffff-1"), null);
  const b = instanceOf("0001", 4, { FORKD_NET_SUBNET: "10.250.0.0/24" });
  assert.deepEqual([slotOf(b, 3).hostAddr, slotOf(b, 3).nsAddr], ["10.250.0.13", "10.250.0.14"]);
  assert.throws(() => instanceOf("0001", 65, { FORKD_NET_SUBNET: "10.250.0.0/24" }), /holds 64/);
  assert.throws(() => slotOf(b, 4), ForkdError);
});

test("the guest's network: one command-line option, QEMU's user-mode numbers", () => {
  assert.equal(guestNetArg(GUEST_NET), "forkd.net=10.0.2.15/24,10.0.2.2,10.0.2.3,52:55:0a:00:02:02");
  assert.equal(guestSubnet(GUEST_NET), "10.0.2.0/24");
});

test("QEMU: the same device on every backend; none is a hub port, tap has no vnet header", () => {
  assert.equal(nicArg(GUEST_NET), "virtio-net-device,netdev=n0,mac=52:54:00:12:34:56");
  assert.equal(netdevArg(GUEST_NET, { kind: "none" }), "hubport,id=n0,hubid=0");
  // vnet_hdr is saved with the device: a state saved on a tap with it would not load elsewhere.
  assert.match(
    netdevArg(GUEST_NET, { kind: "tap", ifname: "tap0" }),
    // The jailer opens it (as root, without IFF_VNET_HDR) and hands it over as fd 3; with an fd,
    // QEMU probes the vnet header from the device, and a vnet_hdr option would be refused.
    /^tap,id=n0,fd=3,vhost=off$/,
  );
  const user = netdevArg(GUEST_NET, {
    kind: "user",
    restrict: true,
    forwards: [{ hostAddr: "127.0.0.1", hostPort: 40000, guestPort: 8000 }],
  });
  assert.equal(
    user,
    "user,id=n0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3,ipv6=off,restrict=on,hostfwd=tcp:127.0.0.1:40000-10.0.2.15:8000",
  );
  const base = {
    dir: "/d",
    machine: { memoryMiB: 256, vcpus: 1, accel: "tcg" as const, cpu: "qemu64" },
    memory: { path: "/m", mode: "child" as const },
    disk: "/disk",
  };
  assert.ok(!qemuArgs(base).includes("-netdev"));
  const withNic = qemuArgs({ ...base, nic: { guest: GUEST_NET, backend: { kind: "none" } } });
  assert.equal(withNic[withNic.indexOf("-device", withNic.indexOf("-netdev")) + 1], nicArg(GUEST_NET));
});

test("egress rules: deny allows nothing; allow keeps out loopback/link-local/multicast; DNS only to the resolver", () => {
  assert.deepEqual(slotRules(egress({ mode: "netns", egress: { mode: "deny" } }), CLOSED), {
    egress: [],
    host: [],
  });
  const allow = slotRules(egress({ mode: "netns" }), CLOSED);
  assert.deepEqual(allow.egress, [
    `ip daddr ${RESOLVER} meta l4proto { tcp, udp } th dport 53 accept`,
    "ip daddr @never reject with icmpx type admin-prohibited",
    "accept",
  ]);
  // The host itself: only its resolver, never "everything".
  assert.deepEqual(allow.host, [
    `ct original ip daddr ${RESOLVER}/32 meta l4proto { tcp, udp } ct original proto-dst { 53 } accept`,
  ]);
  const noDns = slotRules(egress({ mode: "netns", egress: { mode: "allow", dns: false } }), CLOSED);
  assert.equal(
    noDns.egress[0],
    "meta l4proto { tcp, udp } th dport 53 reject with icmpx type admin-prohibited",
  );
  assert.deepEqual(noDns.host, []);
  assert.deepEqual(
    slotRules(egress({ mode: "netns" }), { resolver: null, hostOpen: false }).egress.slice(0, 1),
    ["ip daddr @never reject with icmpx type admin-prohibited"],
  );
  // With host destinations opened by the operator, "allow" reaches them (and only them).
  assert.deepEqual(slotRules(egress({ mode: "netns", egress: { mode: "allow", dns: false } }), OPENED).host, [
    "jump host_open",
  ]);
});

test("list rules: one accept per entry; the host's own addresses never, whatever the list", () => {
  const list = egress({
    mode: "netns",
    egress: {
      mode: "list",
      allow: [
        { cidr: "0.0.0.0/0", ports: [443] },
        { cidr: "192.0.2.10", ports: ["8000-8100", 22] },
        { cidr: "198.51.100.0/24" },
      ],
    },
  });
  const r = slotRules(list, CLOSED);
  assert.deepEqual(r.egress, [
    "ip daddr 0.0.0.0/0 meta l4proto { tcp, udp } th dport { 443 } accept",
    "ip daddr 192.0.2.10/32 meta l4proto { tcp, udp } th dport { 8000-8100, 22 } accept",
    "ip daddr 198.51.100.0/24 accept",
  ]);
  // A single address of the host's, or any entry, opens nothing of the host's: only the operator does.
  assert.deepEqual(r.host, []);
  // Opened by the operator: each entry leads to what the operator opened (both must allow it),
  // on the connection's original destination.
  assert.deepEqual(slotRules(list, OPENED).host, [
    "ct original ip daddr 0.0.0.0/0 meta l4proto { tcp, udp } ct original proto-dst { 443 } jump host_open",
    "ct original ip daddr 192.0.2.10/32 meta l4proto { tcp, udp } ct original proto-dst { 8000-8100, 22 } jump host_open",
    "ct original ip daddr 198.51.100.0/24 jump host_open",
  ]);
});

test("FORKD_NET_HOST_ALLOW: CIDR[:PORTS] entries separated by spaces; anything malformed refused", () => {
  assert.deepEqual(parseHostAllow(undefined), []);
  assert.deepEqual(parseHostAllow("  "), []);
  assert.deepEqual(parseHostAllow("10.0.0.5:3128 192.168.1.0/24:5432,8000-8100\t203.0.113.7"), [
    { cidr: "10.0.0.5/32", ports: [[3128, 3128]] },
    {
      cidr: "192.168.1.0/24",
      ports: [
        [5432, 5432],
        [8000, 8100],
      ],
    },
    { cidr: "203.0.113.7/32" },
  ]);
  for (const bad of ["10.0.0.5:", "10.0.0.5:80,", "10.1.2.3/8", "host.example:80", "10.0.0.5:0", "::1"])
    assert.throws(() => parseHostAllow(bad), ForkdError, bad);
});

test("host table: every slot's chains, replies only into slots, daemon ports refused, masquerade", async () => {
  const script = hostTable(inst, {
    protectedPorts: [8443],
    resolver: RESOLVER,
    hostOpen: [],
    policies: new Map([[2, egress({ mode: "netns" })]]),
  });
  const lines = script.split("\n").map((l) => l.trim());
  // Replaced atomically: never a moment without the table.
  assert.deepEqual(lines.slice(0, 3), [
    "add table inet forkd_ab12",
    "delete table inet forkd_ab12",
    "table inet forkd_ab12 {",
  ]);
  for (let i = 0; i < 8; i++) {
    assert.ok(lines.includes(`chain s${i} {`) && lines.includes(`chain h${i} {`), `slot ${i}`);
    assert.match(script, new RegExp(`"fkab12h${i}" : jump s${i}`));
  }
  const forward = script.slice(script.indexOf("chain forward {"), script.indexOf("chain slot_out {"));
  assert.match(
    forward,
    /oifname "fkab12h\*" ct state established,related accept\n\s+oifname "fkab12h\*" drop/,
  );
  assert.match(script, /tcp dport \{ 8443 \} reject with tcp reset/);
  // To the host (input) and redirected by it (DNAT, in forward): the host's decision, before
  // and without the slot's egress chain; IPv6 dropped on both paths.
  const chain = (name: string) => script.slice(script.indexOf(`chain ${name} {`)).split("}\n")[0] ?? "";
  assert.match(
    chain("slot_to_host"),
    /established,related accept\n\s+meta nfproto != ipv4 drop\n\s+jump to_host\n\s+reject/,
  );
  assert.match(
    chain("slot_out"),
    /meta nfproto != ipv4 drop\n\s+ct status dnat jump to_host\n\s+ct status dnat reject[^\n]*\n\s+iifname vmap \{[^}]*jump s0/,
  );
  assert.doesNotMatch(chain("to_host"), /jump s\d/);
  assert.match(chain("to_host"), /ct original proto-dst \{ 8443 \} reject with tcp reset/);
  assert.doesNotMatch(chain("host_open"), /accept/, "nothing opened");
  const h2 = script.slice(script.indexOf("chain h2 {"), script.indexOf("chain s3 {"));
  assert.deepEqual(
    h2
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => l !== "" && l !== "}"),
    [
      "chain h2 {",
      `ct original ip daddr ${RESOLVER}/32 meta l4proto { tcp, udp } ct original proto-dst { 53 } accept`,
    ],
    "egress allow reaches nothing of the host's but its resolver",
  );
  assert.match(script, /ip saddr 10\.\d+\.\d+\.0\/22 oifname != "fkab12h\*" masquerade/);
  const s2 = script.slice(script.indexOf("chain s2 {"), script.indexOf("chain h2 {"));
  assert.match(s2, /ip daddr @never reject/);
  const s3 = script.slice(script.indexOf("chain s3 {"), script.indexOf("chain h3 {"));
  assert.doesNotMatch(s3, /accept/);
  const checked = await nftChecks(script);
  if (checked !== true) process.stderr.write(`(nft -c skipped: ${checked})\n`);
});

test("slot policy updates flush both chains in one transaction", async () => {
  const list = egress({ mode: "netns", egress: { mode: "list", allow: [{ cidr: "192.0.2.10" }] } });
  assert.deepEqual(slotPolicy(inst, 5, list, CLOSED).trim().split("\n"), [
    "flush chain inet forkd_ab12 s5",
    "flush chain inet forkd_ab12 h5",
    "add rule inet forkd_ab12 s5 ip daddr 192.0.2.10/32 accept",
  ]);
  const text = slotPolicy(inst, 5, list, OPENED);
  assert.deepEqual(text.trim().split("\n").slice(2), [
    "add rule inet forkd_ab12 s5 ip daddr 192.0.2.10/32 accept",
    "add rule inet forkd_ab12 h5 ct original ip daddr 192.0.2.10/32 jump host_open",
  ]);
  assert.equal(slotPolicy(inst, 5, null, CLOSED).trim().split("\n").length, 2);
  const hostOpen = parseHostAllow("192.0.2.10:8080 198.51.100.0/24");
  const table = hostTable(inst, {
    protectedPorts: [8443],
    resolver: RESOLVER,
    hostOpen,
    policies: new Map(),
  });
  const open = table.slice(table.indexOf("chain host_open {")).split("}\n")[0] ?? "";
  assert.match(
    open,
    /ct original ip daddr 192\.0\.2\.10\/32 meta l4proto \{ tcp, udp \} ct original proto-dst \{ 8080 \} accept\n\s+ct original ip daddr 198\.51\.100\.0\/24 accept/,
  );
  const checked = await nftChecks(table + text);
  if (checked !== true) process.stderr.write(`(nft -c skipped: ${checked})\n`);
});

test("slot namespace table: DNS and exposed ports DNATed for a tap, accepted for slirp", async () => {
  const s = slotOf(inst, 1);
  const tap = nsTable(GUEST_NET, s, { backend: "tap", dnsTo: RESOLVER, expose: [80, 8000] });
  assert.match(
    tap,
    new RegExp(
      `iifname "tap0" ip daddr 10\\.0\\.2\\.3 meta l4proto \\{ tcp, udp \\} th dport 53 dnat to ${RESOLVER}`,
    ),
  );
  assert.match(
    tap,
    new RegExp(
      `iifname "veth0" ip daddr ${s.nsAddr.replaceAll(".", "\\.")} tcp dport \\{ 80, 8000 \\} dnat to 10\\.0\\.2\\.15`,
    ),
  );
  assert.match(tap, /oifname "veth0" ip saddr 10\.0\.2\.0\/24 masquerade/);
  assert.match(tap, /iifname "tap0" oifname "veth0" ip saddr 10\.0\.2\.15 accept/);
  const noDns = nsTable(GUEST_NET, s, { backend: "tap", dnsTo: null, expose: [] });
  assert.doesNotMatch(noDns, /dnat to/);
  // slirp answers DNS and exposed ports itself: nothing is DNATed, exposed ports are let in.
  const user = nsTable(GUEST_NET, s, { backend: "user", dnsTo: RESOLVER, expose: [8000] });
  assert.match(user, /iifname "veth0" ip daddr \S+ tcp dport \{ 8000 \} accept/);
  assert.doesNotMatch(user, /dnat to/);
  for (const script of [tap, noDns, user]) {
    const checked = await nftChecks(script);
    if (checked !== true) process.stderr.write(`(nft -c skipped: ${checked})\n`);
  }
});
