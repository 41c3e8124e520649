/** Network requests at the edge: CIDRs, ports, the egress policy's defaults and refusals. */
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  cidrContains,
  MAX_ALLOW_RULES,
  MAX_EXPOSE,
  NO_NETWORK,
  parseCidr,
  parseIpv4,
  parseNetwork,
  parsePortSpec,
} from "../../src/net/policy.js";
import { ForkdError } from "../../src/util/errors.js";
import { GUEST_NET } from "../../src/net/guest.js";
import { NetworkService } from "../../src/net/service.js";
import { nicMeta } from "../../src/snapshot/meta.js";

const invalid = (fn: () => unknown, re: RegExp) =>
  assert.throws(
    fn,
    (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument" && re.test(e.message),
  );

test("IPv4 addresses: dotted quads only", () => {
  assert.equal(parseIpv4("10.0.2.15"), 0x0a00020f);
  assert.equal(parseIpv4("255.255.255.255"), 0xffffffff);
  for (const bad of [
    "10.0.2",
    "10.0.2.256",
    "010.0.0.1",
    "1.2.3.4.5",
    "a.b.c.d",
    "",
    " 1.2.3.4",
    "1.2.3.-1",
  ]) {
    assert.equal(parseIpv4(bad), null, bad);
  }
});

test("CIDRs: a bare address is /32; host bits, bad lengths and other text are refused", () => {
  assert.deepEqual(parseCidr("203.0.113.0/24"), { addr: 0xcb007100, prefix: 24, text: "203.0.113.0/24" });
  assert.equal(parseCidr("198.51.100.7").text, "198.51.100.7/32");
  assert.equal(parseCidr("0.0.0.0/0").prefix, 0);
  invalid(() => parseCidr("10.1.2.3/8"), /host bits set \(the network is 10\.0\.0\.0\/8/);
  for (const bad of [
    "10.0.0.0/33",
    "10.0.0.0/-1",
    "10.0.0.0/",
    "10.0.0.0/8/8",
    "::1/128",
    "example.com",
    "10.0.0.0/08",
  ]) {
    invalid(() => parseCidr(bad), /not an IPv4 CIDR/);
  }
  const net = parseCidr("10.200.0.0/22");
  assert.ok(cidrContains(net, parseIpv4("10.200.3.255") as number));
  assert.ok(!cidrContains(net, parseIpv4("10.200.4.0") as number));
});

test("ports: single ports and inclusive ranges within 1-65535", () => {
  assert.deepEqual(parsePortSpec(443), [443, 443]);
  assert.deepEqual(parsePortSpec("8000-8100"), [8000, 8100]);
  assert.deepEqual(parsePortSpec("1-65535"), [1, 65535]);
  for (const bad of [0, 65536, 1.5, "80", "100-99", "0-10", "1-65536", "a-b", "80-"]) {
    invalid(() => parsePortSpec(bad), /port/);
  }
});

test("no request, or mode none, is no network", () => {
  assert.deepEqual(parseNetwork(undefined), NO_NETWORK);
  assert.deepEqual(parseNetwork({ mode: "none" }), NO_NETWORK);
  assert.deepEqual(parseNetwork({}), NO_NETWORK);
  invalid(() => parseNetwork({ mode: "none", egress: { mode: "allow" } }), /has no egress/);
  invalid(() => parseNetwork({ mode: "none", expose: [80] }), /cannot expose/);
});

test("egress defaults: allow with DNS; deny never answers DNS; a list answers it only when asked", () => {
  assert.deepEqual(parseNetwork({ mode: "netns" }).egress, { mode: "allow", allow: [], dns: true });
  assert.deepEqual(parseNetwork({ mode: "user", egress: { mode: "allow", dns: false } }).egress, {
    mode: "allow",
    allow: [],
    dns: false,
  });
  assert.deepEqual(parseNetwork({ mode: "netns", egress: { mode: "deny" } }).egress, {
    mode: "deny",
    allow: [],
    dns: false,
  });
  invalid(() => parseNetwork({ mode: "netns", egress: { mode: "deny", dns: true } }), /answers no DNS/);
  const list = parseNetwork({
    mode: "netns",
    egress: {
      mode: "list",
      allow: [{ cidr: "203.0.113.0/24", ports: [443, "8000-8100"] }, { cidr: "198.51.100.7" }],
    },
  });
  assert.deepEqual(list.egress, {
    mode: "list",
    allow: [
      {
        cidr: "203.0.113.0/24",
        ports: [
          [443, 443],
          [8000, 8100],
        ],
      },
      { cidr: "198.51.100.7/32" },
    ],
    dns: false,
  });
  assert.equal(parseNetwork({ mode: "netns", egress: { mode: "list", dns: true } }).egress.dns, true);
});

test("list refusals name the field: empty, too long, bad entries, allow outside list", () => {
  invalid(() => parseNetwork({ mode: "netns", egress: { mode: "list" } }), /at least one entry/);
  invalid(
    () => parseNetwork({ mode: "netns", egress: { mode: "allow", allow: [{ cidr: "1.2.3.4" }] } }),
    /only for egress mode "list"/,
  );
  const many = Array.from({ length: MAX_ALLOW_RULES + 1 }, (_, i) => ({ cidr: `10.0.${i}.0/24` }));
  invalid(() => parseNetwork({ mode: "netns", egress: { mode: "list", allow: many } }), /at most 64/);
  invalid(
    () => parseNetwork({ mode: "netns", egress: { mode: "list", allow: [{ cidr: "10.0.0.1/8" }] } }),
    /network\.egress\.allow\[0\]\.cidr: 10\.0\.0\.1\/8 has host bits set/,
  );
  invalid(
    () =>
      parseNetwork({ mode: "netns", egress: { mode: "list", allow: [{ cidr: "10.0.0.0/8", ports: [] }] } }),
    /1 to 32 ports/,
  );
  invalid(
    () =>
      parseNetwork({
        mode: "netns",
        egress: { mode: "list", allow: [{ cidr: "10.0.0.0/8", ports: ["9-1"] }] },
      }),
    /allow\[0\]\.ports/,
  );
});

test("exposed ports: deduplicated, sorted, bounded", () => {
  assert.deepEqual(parseNetwork({ mode: "netns", expose: [8080, 80, 8080] }).expose, [80, 8080]);
  invalid(() => parseNetwork({ mode: "netns", expose: [0] }), /not a port/);
  const many = Array.from({ length: MAX_EXPOSE + 1 }, (_, i) => 1000 + i);
  invalid(() => parseNetwork({ mode: "netns", expose: many }), /at most 16/);
});

test("a snapshot without a NIC forks only without a network; a mode the host lacks is unavailable", () => {
  const net = NetworkService.disabled({ info: () => undefined, warn: () => undefined });
  const netns = parseNetwork({ mode: "netns" });
  // Snapshots made before networking have no `nic`: refused before anything starts.
  assert.throws(
    () => net.check(netns, undefined, "old"),
    (e: unknown) =>
      e instanceof ForkdError && e.code === "invalid_argument" && /made before networking/.test(e.message),
  );
  net.check(NO_NETWORK, undefined, "old");
  const nic = nicMeta(GUEST_NET, false);
  for (const spec of [netns, parseNetwork({ mode: "user", egress: { mode: "deny" } })]) {
    assert.throws(
      () => net.check(spec, nic, "new"),
      (e: unknown) =>
        e instanceof ForkdError &&
        e.code === "unavailable" &&
        e.message.includes(`"${spec.mode}" is unavailable`) &&
        typeof e.details.reason === "string",
    );
  }
  assert.throws(
    () => net.check(netns, { ...nic, addr: "10.9.9.9" }, "other"),
    (e: unknown) => e instanceof ForkdError && /another guest network/.test(e.message),
  );
});
