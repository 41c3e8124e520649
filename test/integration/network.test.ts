/**
 * Networking per child with real VMs: netns children with the same guest address reaching an
 * allowed server outside and not each other, an egress allow-list enforced on the host, exposed
 * guest ports answering on the host, user mode with egress deny, none, the host's own services
 * out of reach, and slots recycled after use.
 *
 * "Outside" is a network namespace of the test's own (a veth to the host, like any next hop):
 * a server there is a destination a child reaches through its slot's NAT and the host's policy,
 * not one of the host's own services (those are refused to every child). Needs root and nft;
 * skipped otherwise.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFile, readlink, stat } from "node:fs/promises";
import { connect, createServer } from "node:net";
import type { Server } from "node:net";
import { join } from "node:path";
import { Sandbox } from "@forkd/sdk";
import { instanceId, instanceOf, slotOf } from "../../src/net/slots.js";
import { run } from "../../src/util/proc.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { checkedRequest } from "../helpers/contract.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { ApiError, rawRequest, readAll } from "../helpers/http.js";

const TAG = "nettest";
const SKIP = process.getuid?.() !== 0 ? "needs root (network namespaces, nftables)" : false;

interface View {
  id: string;
  network: {
    mode: string;
    guest_ip: string | null;
    egress: { mode: string; dns: boolean } | null;
    ports: Array<{ port: number; host: string }>;
  };
}
interface ExecOut {
  exit_code: number | null;
  stdout: string;
  stderr: string;
}

let d: TestDaemon;
let failed = false;
// The test's "outside": namespace, addresses, servers.
const OUT_NS = `fkit-${randomBytes(3).toString("hex")}`;
const OUT_HOST_IF = `${OUT_NS}h`;
// A random /24 of 10.252.10-209.0 (the third octet must stay a byte).
const OUT_NET = 10 + ((randomBytes(1)[0] ?? 0) % 200);
const OUTSIDE = `10.252.${OUT_NET}.2`;
const OUTSIDE_GW = `10.252.${OUT_NET}.1`;
const ALLOWED_PORT = 18081;
const DENIED_PORT = 18082;
/** An echo server outside: a connection that stays open across a policy change. */
const ECHO_PORT = 18083;
/**
 * A port of the host's "published" to the outside's allowed server by a DNAT rule of the test's
 * own (as a container runtime publishes a container's port on every host address).
 */
const PUBLISHED_PORT = 18084;
const DNAT_TABLE = `${OUT_NS.replaceAll("-", "_")}_dnat`;
/** An address given to a host interface while the daemon runs. */
const LATE_HOST_IP = `10.252.${OUT_NET}.9`;
let servers: ChildProcess | null = null;
let hostService: Server | null = null;
let hostServicePort = 0;
const ids: Record<string, string> = {};

const api = <T>(method: string, path: string, body?: unknown) => checkedRequest<T>(d.ep, method, path, body);
const sid = (name: string): string => {
  const v = ids[name];
  if (!v) throw new Error(`no sandbox ${name}: an earlier step failed`);
  return v;
};
const exec = (id: string, cmd: string[], timeoutMs = 120_000) =>
  api<ExecOut>("POST", `/v1/sandboxes/${id}/exec`, { cmd, timeout_ms: timeoutMs });

/** Connects from the guest to each "host:port"; one line each: OPEN <first line received>, or the error. */
const PROBE = `
import socket, sys
for t in sys.argv[1:]:
    h, p = t.rsplit(":", 1)
    try:
        s = socket.create_connection((h, int(p)), 5)
        s.settimeout(5)
        try:
            data = s.recv(200).decode(errors="replace").strip()
        except Exception:
            data = ""
        s.close()
        print(t, "OPEN", data)
    except Exception as e:
        print(t, "FAIL", type(e).__name__)
`;

/** A guest TCP server: says "guest <hostname>" to every connection. */
const GUEST_SERVER = `
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]) if len(sys.argv) > 1 else 8000)); s.listen(16)
import os
name = os.uname().nodename
while True:
    c, _ = s.accept()
    c.sendall(("guest " + name + "\\n").encode()); c.close()
`;

async function probe(id: string, targets: string[]): Promise<Map<string, string>> {
  const r = await exec(id, ["python3", "/tmp/probe.py", ...targets]);
  assert.equal(r.exit_code, 0, r.stderr);
  const out = new Map<string, string>();
  for (const line of r.stdout.trim().split("\n")) {
    const [t, ...rest] = line.split(" ");
    if (t) out.set(t, rest.join(" "));
  }
  return out;
}

async function putFile(id: string, path: string, text: string): Promise<void> {
  const res = await rawRequest(
    d.ep,
    "PUT",
    `/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`,
    text,
    60_000,
    {
      "content-type": "application/octet-stream",
    },
  );
  const body = (await readAll(res)).toString();
  assert.ok(res.statusCode === 200 || res.statusCode === 201, body);
}

/** Reads the first line a TCP server at host:port sends (null if it cannot connect). */
function readLine(hostPort: string, timeoutMs = 5_000): Promise<string | null> {
  const [host, port] = [
    hostPort.slice(0, hostPort.lastIndexOf(":")),
    Number(hostPort.slice(hostPort.lastIndexOf(":") + 1)),
  ];
  return new Promise((resolve) => {
    const s = connect({ host, port });
    let buf = "";
    const t = setTimeout(() => {
      s.destroy();
      resolve(null);
    }, timeoutMs);
    s.on("data", (c: Buffer) => (buf += c.toString()));
    s.on("error", () => {
      clearTimeout(t);
      resolve(null);
    });
    s.on("close", () => {
      clearTimeout(t);
      resolve(buf.trim() || null);
    });
  });
}

async function waitFor<T>(what: string, fn: () => Promise<T | null>, timeoutMs = 120_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== null) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

async function startGuestServer(id: string, port = 8000): Promise<void> {
  await putFile(id, "/tmp/server.py", GUEST_SERVER);
  await exec(id, ["sh", "-c", `nohup python3 /tmp/server.py ${port} >/dev/null 2>&1 &`]);
}

/** The slot a sandbox's VMM runs in, from its record (the API does not show slots). */
async function slotAddr(
  id: string,
): Promise<{ index: number; nsAddr: string; hostAddr: string; netnsPath: string }> {
  const rec = JSON.parse(await readFile(join(d.dataDir, "sandboxes", id, "sandbox.json"), "utf8")) as {
    network: { slot: number };
  };
  const s = slotOf(instanceOf(instanceId(d.dataDir, {}), 64, {}), rec.network.slot);
  return { index: s.index, nsAddr: s.nsAddr, hostAddr: s.hostAddr, netnsPath: s.netnsPath };
}

async function spawnOne(name: string, network: unknown): Promise<View> {
  const r = await api<{ sandboxes: View[]; failures: unknown[] }>("POST", "/v1/sandboxes", {
    snapshot_tag: TAG,
    network,
  });
  assert.deepEqual(r.failures, []);
  const v = r.sandboxes[0];
  assert.ok(v);
  ids[name] = v.id;
  await putFile(v.id, "/tmp/probe.py", PROBE);
  return v;
}

const step = (name: string, fn: () => Promise<void>): void =>
  void test(name, { skip: SKIP }, async () => {
    try {
      await fn();
    } catch (e) {
      failed = true;
      throw e;
    }
  });

before(async () => {
  if (SKIP) return;
  // The outside: a namespace with two servers, routed from the host over a veth.
  await run("ip", ["netns", "add", OUT_NS]);
  await run("ip", ["link", "add", OUT_HOST_IF, "type", "veth", "peer", "name", "eth0", "netns", OUT_NS]);
  await run("ip", ["addr", "add", `${OUTSIDE_GW}/30`, "dev", OUT_HOST_IF]);
  await run("ip", ["link", "set", OUT_HOST_IF, "up"]);
  await run("ip", ["-n", OUT_NS, "addr", "add", `${OUTSIDE}/30`, "dev", "eth0"]);
  await run("ip", ["-n", OUT_NS, "link", "set", "eth0", "up"]);
  await run("ip", ["-n", OUT_NS, "link", "set", "lo", "up"]);
  await run("ip", ["-n", OUT_NS, "route", "add", "default", "via", OUTSIDE_GW]);
  const py = `
import socket, threading
def serve(port, word):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("${OUTSIDE}", port)); s.listen(64)
    while True:
        c, _ = s.accept(); c.sendall((word + "\\n").encode()); c.close()
def echo(c):
    while True:
        d = c.recv(100)
        if not d: break
        c.sendall(d)
def echoes():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("${OUTSIDE}", ${ECHO_PORT})); s.listen(64)
    while True:
        c, _ = s.accept(); threading.Thread(target=echo, args=(c,), daemon=True).start()
threading.Thread(target=echoes, daemon=True).start()
threading.Thread(target=serve, args=(${DENIED_PORT}, "denied-server"), daemon=True).start()
serve(${ALLOWED_PORT}, "allowed-server")
`;
  servers = spawn("ip", ["netns", "exec", OUT_NS, "python3", "-c", py], { stdio: "ignore" });
  await waitFor("the outside servers", async () => readLine(`${OUTSIDE}:${DENIED_PORT}`, 1_000));
  // A service of the host itself, on every address.
  hostService = createServer((c) => c.end("host-service\n"));
  await new Promise<void>((r) => hostService?.listen(0, "0.0.0.0", () => r()));
  const a = hostService.address();
  hostServicePort = typeof a === "object" && a ? a.port : 0;
  await run("nft", ["-f", "-"], {
    input: `table ip ${DNAT_TABLE} {
  chain pre {
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr ${OUTSIDE_GW} tcp dport ${PUBLISHED_PORT} dnat to ${OUTSIDE}:${ALLOWED_PORT}
  }
  chain out {
    type nat hook output priority -100; policy accept;
    ip daddr ${OUTSIDE_GW} tcp dport ${PUBLISHED_PORT} dnat to ${OUTSIDE}:${ALLOWED_PORT}
  }
}
`,
  });
  d = await makeDaemon({ FORKD_NET_SLOTS: "2", FORKD_POOL_SIZE: "1" });
});

after(async () => {
  if (SKIP) return;
  await d?.destroy(failed);
  servers?.kill("SIGKILL");
  hostService?.close();
  await run("nft", ["delete", "table", "ip", DNAT_TABLE]).catch(() => undefined);
  await run("ip", ["netns", "del", OUT_NS]).catch(() => undefined);
  await run("ip", ["link", "del", OUT_HOST_IF]).catch(() => undefined);
});

step("a snapshot has a NIC, with the link saved down", async () => {
  const snap = await api<{ nic?: { addr: string; link_up: boolean } }>("POST", "/v1/snapshots", {
    tag: TAG,
    memory_mib: 512,
  });
  assert.equal(snap.nic?.addr, "10.0.2.15");
  assert.equal(snap.nic?.link_up, false);
});

step(
  "two netns children have the same address; both reach the allowed server, neither the other",
  async () => {
    const net = {
      mode: "netns",
      egress: { mode: "list", allow: [{ cidr: `${OUTSIDE}/32`, ports: [ALLOWED_PORT] }] },
      expose: [8000],
    };
    const [a, b] = await Promise.all([spawnOne("a", net), spawnOne("b", net)]);
    for (const v of [a, b]) {
      assert.equal(v.network.mode, "netns");
      assert.equal(v.network.guest_ip, "10.0.2.15");
      assert.equal(v.network.egress?.mode, "list");
      const r = await exec(v.id, [
        "python3",
        "-c",
        "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.connect(('10.0.2.2',9));print(s.getsockname()[0])",
      ]);
      assert.equal(r.stdout.trim(), "10.0.2.15", "the guest's own address");
    }
    await Promise.all([startGuestServer(sid("a")), startGuestServer(sid("b"))]);
    const slotA = await slotAddr(sid("a"));
    const slotB = await slotAddr(sid("b"));
    assert.notEqual(slotA.nsAddr, slotB.nsAddr);
    // Each VMM is jailed in its slot: an unprivileged uid without capabilities, in the slot's
    // namespace, holding the tap the jailer attached for it (it could not attach one itself).
    for (const [v, slot] of [
      [a, slotA],
      [b, slotB],
    ] as const) {
      const { pid } = await api<{ pid: number }>("GET", `/v1/sandboxes/${v.id}`);
      const status = await readFile(`/proc/${pid}/status`, "utf8");
      const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
      assert.ok(uid > 0, `VMM uid ${uid}`);
      assert.match(status, /^CapEff:\s+0+$/m);
      assert.equal((await stat(`/proc/${pid}/ns/net`)).ino, (await stat(slot.netnsPath)).ino);
      assert.equal(await readlink(`/proc/${pid}/fd/3`), "/dev/net/tun");
    }
    // Both guest servers answer from the host (so "unreachable" below is the policy's doing).
    const portOf = (v: View) => v.network.ports.find((p) => p.port === 8000)?.host ?? "";
    assert.equal(await waitFor("a's server", () => readLine(portOf(a))), `guest ${sid("a")}`);
    assert.equal(await waitFor("b's server", () => readLine(portOf(b))), `guest ${sid("b")}`);
    const allowed = `${OUTSIDE}:${ALLOWED_PORT}`;
    const ra = await probe(sid("a"), [allowed, `${slotB.nsAddr}:8000`, `${slotB.hostAddr}:8000`]);
    const rb = await probe(sid("b"), [allowed, `${slotA.nsAddr}:8000`, `${slotA.hostAddr}:8000`]);
    assert.equal(ra.get(allowed), "OPEN allowed-server");
    assert.equal(rb.get(allowed), "OPEN allowed-server");
    assert.match(ra.get(`${slotB.nsAddr}:8000`) ?? "", /^FAIL/, "a reaches b");
    assert.match(rb.get(`${slotA.nsAddr}:8000`) ?? "", /^FAIL/, "b reaches a");
    assert.match(ra.get(`${slotB.hostAddr}:8000`) ?? "", /^FAIL/);
  },
);

step("the allow-list is enforced on the host: a denied destination is unreachable, DNS off", async () => {
  const r = await probe(sid("a"), [`${OUTSIDE}:${DENIED_PORT}`, `${OUTSIDE}:${ALLOWED_PORT}`, "10.0.2.3:53"]);
  assert.match(r.get(`${OUTSIDE}:${DENIED_PORT}`) ?? "", /^FAIL/);
  assert.equal(r.get(`${OUTSIDE}:${ALLOWED_PORT}`), "OPEN allowed-server");
  assert.match(r.get("10.0.2.3:53") ?? "", /^FAIL/);
  // The same server port is open to a child whose policy allows it: the policy, not the server.
  const c = await spawnOne("c", { mode: "netns", egress: { mode: "allow" } });
  assert.deepEqual(c.network.egress, { mode: "allow", allow: [], dns: true });
  const rc = await probe(sid("c"), [`${OUTSIDE}:${DENIED_PORT}`, `${OUTSIDE}:${ALLOWED_PORT}`]);
  assert.equal(rc.get(`${OUTSIDE}:${DENIED_PORT}`), "OPEN denied-server");
  assert.equal(rc.get(`${OUTSIDE}:${ALLOWED_PORT}`), "OPEN allowed-server");
});

step("the host's own services are out of reach even with egress allow", async () => {
  const { hostAddr } = await slotAddr(sid("c"));
  const routes = (await run("ip", ["-4", "-o", "addr", "show", "scope", "global"])).stdout;
  const hostIps = [...routes.matchAll(/inet (\d+\.\d+\.\d+\.\d+)\//g)]
    .map((m) => m[1] ?? "")
    .filter((ip) => ip && ip !== OUTSIDE_GW && ip !== hostAddr)
    .slice(0, 2);
  const targets = [`${hostAddr}:${hostServicePort}`, ...hostIps.map((ip) => `${ip}:${hostServicePort}`)];
  assert.ok((await readLine(`127.0.0.1:${hostServicePort}`)) === "host-service", "the host service runs");
  const r = await probe(sid("c"), targets);
  for (const t of targets) assert.match(r.get(t) ?? "", /^FAIL/, `${t} from a child`);
});

step("a tenant's allow-list never opens the host's addresses nor another sandbox's", async () => {
  // The host's addresses: the test's veth (a non-loopback address of a host interface), one
  // given to it only now, the slots' host ends, and any other global address of the host.
  await run("ip", ["addr", "add", `${LATE_HOST_IP}/32`, "dev", OUT_HOST_IF]);
  // The address the host's default route leaves from (its main interface's), when it has one.
  const via = await run("ip", ["-4", "-o", "route", "get", "192.0.2.1"]).catch(() => ({ stdout: "" }));
  const other = /\bsrc (\d+\.\d+\.\d+\.\d+)/.exec(via.stdout)?.[1];
  const slotB = await slotAddr(sid("b"));
  const hostIps = [OUTSIDE_GW, LATE_HOST_IP, slotB.hostAddr, ...(other ? [other] : [])];
  const h = await spawnOne("h", {
    mode: "netns",
    egress: {
      mode: "list",
      allow: [
        ...hostIps.map((ip) => ({ cidr: `${ip}/32` })),
        { cidr: `${slotB.nsAddr}/32` },
        { cidr: `${OUTSIDE}/32`, ports: [ALLOWED_PORT] },
      ],
    },
  });
  const own = await slotAddr(h.id);
  const targets = [...hostIps, own.hostAddr].map((ip) => `${ip}:${hostServicePort}`);
  const published = `${OUTSIDE_GW}:${PUBLISHED_PORT}`;
  const sibling = `${slotB.nsAddr}:8000`;
  assert.equal(await readLine(`${OUTSIDE_GW}:${hostServicePort}`), "host-service", "the host service runs");
  assert.equal(await readLine(published), "allowed-server", "the published port leads outside");
  let r = await probe(h.id, [...targets, published, sibling, `${OUTSIDE}:${ALLOWED_PORT}`]);
  assert.equal(r.get(`${OUTSIDE}:${ALLOWED_PORT}`), "OPEN allowed-server", "the list is in force");
  for (const t of [...targets, published, sibling]) assert.match(r.get(t) ?? "", /^FAIL/, `${t} from h`);
  // The same when the list comes later (E2B's updateNetwork takes this path too: setEgress).
  await api<View>("POST", `/v1/sandboxes/${h.id}/egress`, {
    mode: "list",
    allow: [{ cidr: `${OUTSIDE_GW}/32` }, { cidr: "0.0.0.0/0", ports: [hostServicePort, PUBLISHED_PORT] }],
  });
  r = await probe(h.id, [
    `${OUTSIDE_GW}:${hostServicePort}`,
    published,
    `${own.hostAddr}:${hostServicePort}`,
  ]);
  for (const [t, res] of r) assert.match(res, /^FAIL/, `${t} from h after the change`);
  // Egress allow reaches the outside's server, but not through the host's published port.
  r = await probe(sid("c"), [`${OUTSIDE}:${ALLOWED_PORT}`, published]);
  assert.equal(r.get(`${OUTSIDE}:${ALLOWED_PORT}`), "OPEN allowed-server");
  assert.match(r.get(published) ?? "", /^FAIL/, "a DNAT of the host's is the host's");
});

step("an exposed guest port answers on the host, and getHost() says where", async () => {
  const sb = await Sandbox.connect(sid("a"), { socket: d.ep.socket });
  const where = await sb.getHost(8000);
  assert.match(where, /^127\.0\.0\.1:\d+$/);
  assert.equal(await readLine(where), `guest ${sid("a")}`);
  // The Python SDK says the same.
  const py = await run(
    "python3",
    [
      "-c",
      "import sys; sys.path.insert(0, sys.argv[3]); from forkd import Sandbox; " +
        "print(Sandbox.connect(sys.argv[1], socket_path=sys.argv[2]).get_host(8000))",
      sid("a"),
      d.ep.socket ?? "",
      join(REPO_DIR, "sdk/python/src"),
    ],
    { timeoutMs: 30_000 },
  ).catch((e: unknown) => ({ stdout: String(e) }));
  assert.equal(py.stdout.trim(), where);
  const view = await api<View>("GET", `/v1/sandboxes/${sid("a")}`);
  assert.deepEqual(view.network.ports, [{ port: 8000, host: where }]);
  // A port not exposed at creation is exposed while it runs: getHost() asks for it.
  await startGuestServer(sid("a"), 8001);
  const late = await sb.getHost(8001);
  assert.notEqual(late, where);
  assert.equal(await waitFor("a's late port", () => readLine(late)), `guest ${sid("a")}`);
  const again = await api<View>("POST", `/v1/sandboxes/${sid("a")}/ports`, { port: 8001 });
  assert.deepEqual(
    again.network.ports.map((p) => p.port),
    [8000, 8001],
    "exposing it again changes nothing",
  );
  // b's same guest port is not reachable through a's exposure: each slot DNATs to its own guest.
  assert.equal(await readLine(late), `guest ${sid("a")}`);
  // And no longer exposed: the host port is closed, the other one still answers.
  await sb.unexpose(8001);
  assert.equal(await readLine(late, 2_000), null);
  assert.equal(await readLine(where), `guest ${sid("a")}`);
  const after = await api<View>("DELETE", `/v1/sandboxes/${sid("a")}/ports/8001`);
  assert.deepEqual(after.network.ports, [{ port: 8000, host: where }], "removing it again changes nothing");
  await assert.rejects(
    api("DELETE", `/v1/sandboxes/${sid("a")}/ports/http`),
    (e: unknown) => e instanceof ApiError && e.status === 400,
  );
});

step("user mode with egress deny: no way out, no DNS; exposed ports still answer", async () => {
  const u = await spawnOne("u", { mode: "user", egress: { mode: "deny" }, expose: [8000] });
  assert.equal(u.network.mode, "user");
  const r = await probe(sid("u"), [
    `${OUTSIDE}:${ALLOWED_PORT}`,
    `10.0.2.2:${hostServicePort}`,
    "10.0.2.3:53",
  ]);
  for (const [t, res] of r) assert.match(res, /^FAIL/, t);
  const dns = await exec(sid("u"), [
    "python3",
    "-c",
    "import socket\ntry:\n socket.gethostbyname('example.com'); print('resolved')\nexcept Exception as e: print('no-dns')",
  ]);
  assert.equal(dns.stdout.trim(), "no-dns");
  await startGuestServer(sid("u"));
  const host = u.network.ports[0]?.host ?? "";
  assert.equal(await waitFor("u's server", () => readLine(host)), `guest ${sid("u")}`);
  // Exposed while it runs: a slirp forward added to the running VMM.
  await startGuestServer(sid("u"), 8001);
  const v = await api<View>("POST", `/v1/sandboxes/${sid("u")}/ports`, { port: 8001 });
  const late = v.network.ports.find((p) => p.port === 8001)?.host ?? "";
  assert.match(late, /^127\.0\.0\.1:\d+$/);
  assert.equal(await waitFor("u's late port", () => readLine(late)), `guest ${sid("u")}`);
  const gone = await api<View>("DELETE", `/v1/sandboxes/${sid("u")}/ports/8001`);
  assert.deepEqual(
    gone.network.ports.map((p) => p.port),
    [8000],
  );
  assert.equal(await readLine(late, 2_000), null, "slirp's forward is removed");
});

/** In the guest: one echo connection; "1" answered, then after /tmp/go, "2" (or the error). */
const HOLD = `
import socket, os, time
s = socket.create_connection(("${OUTSIDE}", ${ECHO_PORT}), 5); s.settimeout(5)
s.sendall(b"1"); open("/tmp/out1", "w").write(s.recv(10).decode())
for _ in range(1200):  # at most 2 minutes
    if os.path.exists("/tmp/go"): break
    time.sleep(0.1)
try:
    s.sendall(b"2"); r = s.recv(10).decode() or "closed"
except Exception as e:
    r = "FAIL " + type(e).__name__
open("/tmp/out2", "w").write(r)
`;

step("the egress policy changes while a sandbox runs; flows it no longer allows stop", async () => {
  const e = await spawnOne("e", { mode: "netns", egress: { mode: "allow" } });
  const allowed = `${OUTSIDE}:${ALLOWED_PORT}`;
  const denied = `${OUTSIDE}:${DENIED_PORT}`;
  let r = await probe(e.id, [allowed, denied]);
  assert.equal(r.get(allowed), "OPEN allowed-server");
  assert.equal(r.get(denied), "OPEN denied-server");
  // A connection open under "allow".
  await putFile(e.id, "/tmp/hold.py", HOLD);
  await exec(e.id, ["sh", "-c", "nohup python3 /tmp/hold.py >/tmp/hold.log 2>&1 &"]);
  const cat = (f: string) => async () => {
    const o = await exec(e.id, ["cat", f]);
    return o.exit_code === 0 && o.stdout !== "" ? o.stdout : null;
  };
  assert.equal(await waitFor("the echo", cat("/tmp/out1"), 30_000), "1");
  // Down to an allow-list of one port: the new connections follow it, the open one stops.
  const v = await api<View>("POST", `/v1/sandboxes/${e.id}/egress`, {
    mode: "list",
    allow: [{ cidr: `${OUTSIDE}/32`, ports: [DENIED_PORT] }],
  });
  assert.deepEqual(v.network.egress, {
    mode: "list",
    allow: [{ cidr: `${OUTSIDE}/32`, ports: [DENIED_PORT] }],
    dns: false,
  });
  await exec(e.id, ["touch", "/tmp/go"]);
  assert.match(await waitFor("the echo after", cat("/tmp/out2"), 30_000), /^FAIL/);
  r = await probe(e.id, [allowed, denied]);
  assert.match(r.get(allowed) ?? "", /^FAIL/);
  assert.equal(r.get(denied), "OPEN denied-server");
  // Kept in the record (a restarted daemon or a resume applies it again).
  const rec = JSON.parse(await readFile(join(d.dataDir, "sandboxes", e.id, "sandbox.json"), "utf8")) as {
    network: { egress: { mode: string } };
  };
  assert.equal(rec.network.egress.mode, "list");
  // Paused and resumed: its VMM comes back jailed in a slot, with the new policy and its port.
  await startGuestServer(e.id);
  await api<View>("POST", `/v1/sandboxes/${e.id}/ports`, { port: 8000 });
  await api("POST", `/v1/sandboxes/${e.id}/pause`);
  const back = await api<View & { pid: number }>("POST", `/v1/sandboxes/${e.id}/resume`);
  assert.equal(back.network.egress?.mode, "list");
  const at = back.network.ports.find((p) => p.port === 8000)?.host ?? "";
  assert.equal(await waitFor("e's port after resume", () => readLine(at)), `guest ${e.id}`);
  r = await probe(e.id, [allowed, denied]);
  assert.match(r.get(allowed) ?? "", /^FAIL/);
  assert.equal(r.get(denied), "OPEN denied-server");
  const slot = await slotAddr(e.id);
  assert.equal((await stat(`/proc/${back.pid}/ns/net`)).ino, (await stat(slot.netnsPath)).ino);
  assert.equal(await readlink(`/proc/${back.pid}/fd/3`), "/dev/net/tun");
  assert.match(await readFile(`/proc/${back.pid}/status`, "utf8"), /^CapEff:\s+0+$/m);
  // A user-mode sandbox with egress deny has its policy in slirp: it cannot change (409).
  await assert.rejects(
    api("POST", `/v1/sandboxes/${sid("u")}/egress`, { mode: "allow" }),
    (x: unknown) => x instanceof ApiError && x.status === 409 && /fixed/.test(x.message),
  );
  // Validated like at creation.
  await assert.rejects(
    api("POST", `/v1/sandboxes/${e.id}/egress`, { mode: "list", allow: [{ cidr: "10.0.0.1/8" }] }),
    (x: unknown) => x instanceof ApiError && x.status === 400 && /host bits set/.test(x.message),
  );
  await api("DELETE", `/v1/sandboxes/${e.id}`);
});

step("network none: the link is down and nothing is reachable", async () => {
  const n = await spawnOne("n", undefined);
  assert.deepEqual(n.network, { mode: "none", guest_ip: null, egress: null, ports: [] });
  const st = await exec(sid("n"), ["cat", "/sys/class/net/eth0/operstate"]);
  assert.equal(st.stdout.trim(), "down");
  const r = await probe(sid("n"), [`${OUTSIDE}:${ALLOWED_PORT}`]);
  assert.match(r.get(`${OUTSIDE}:${ALLOWED_PORT}`) ?? "", /^FAIL OSError|^FAIL .*Unreach/);
  await assert.rejects(
    api("POST", `/v1/sandboxes/${sid("n")}/ports`, { port: 8000 }),
    (e: unknown) => e instanceof ApiError && e.status === 400 && /has no network/.test(e.message),
  );
  await assert.rejects(
    api("POST", `/v1/sandboxes/${sid("n")}/ports`, { port: 0 }),
    (e: unknown) => e instanceof ApiError && e.status === 400,
  );
});

step("a restore raises no interrupt on the NIC: no self-announcement after the load", async () => {
  // A child starts with the interrupt counts its parent had at the freeze, and a branch of a
  // child is such a parent again: a grandchild counts exactly what its parent counted when it
  // was branched, unless the restore itself raised something on the NIC. QEMU's announcement
  // after a migration did: a config interrupt the guest driver answers (netdev_notify_peers, a
  // control-queue ack), guest work on every fork for nothing (docs/architecture.md).
  const nicIrqs = async (id: string): Promise<number> => {
    const r = await exec(id, [
      "sh",
      "-c",
      'v=$(basename "$(readlink -f /sys/class/net/eth0/device)"); grep " $v$" /proc/interrupts',
    ]);
    const m = /^\s*\d+:\s+(\d+)\s/.exec(r.stdout);
    assert.ok(m, `no interrupt line for eth0's device: ${r.stdout} ${r.stderr}`);
    return Number(m[1]);
  };
  const parent = await spawnOne("announce-parent", undefined);
  const atBranch = await nicIrqs(parent.id);
  await api("POST", `/v1/sandboxes/${parent.id}/branch`, { tag: "announce-branch" });
  try {
    const r = await api<{ sandboxes: View[]; failures: unknown[] }>("POST", "/v1/sandboxes", {
      snapshot_tag: "announce-branch",
    });
    assert.deepEqual(r.failures, []);
    const child = r.sandboxes[0];
    assert.ok(child);
    // Long enough for every round QEMU would announce in (the last at ~0.5 s after the load).
    await new Promise((res) => setTimeout(res, 1_500));
    assert.equal(await nicIrqs(child.id), atBranch);
    assert.equal((await exec(child.id, ["cat", "/sys/class/net/eth0/operstate"])).stdout.trim(), "down");
    await api("DELETE", `/v1/sandboxes/${child.id}`);
  } finally {
    await api("DELETE", `/v1/sandboxes/${parent.id}`).catch(() => undefined);
    await api("DELETE", "/v1/snapshots/announce-branch").catch(() => undefined);
  }
});

step(
  "a snapshot made with nic: false has no network device, and its children only network none",
  async () => {
    const tag = "no-nic";
    const snap = await api<{ nic?: unknown }>("POST", "/v1/snapshots", { tag, memory_mib: 256, nic: false });
    try {
      assert.equal(snap.nic, undefined, "no NIC in the snapshot's metadata");
      const r = await api<{ sandboxes: View[]; failures: unknown[] }>("POST", "/v1/sandboxes", {
        snapshot_tag: tag,
      });
      assert.deepEqual(r.failures, []);
      const child = r.sandboxes[0];
      assert.ok(child);
      assert.equal(child.network.mode, "none");
      const ls = await exec(child.id, ["ls", "/sys/class/net"]);
      assert.deepEqual(ls.stdout.trim().split(/\s+/), ["lo"], "no eth0 in the guest");
      await api("DELETE", `/v1/sandboxes/${child.id}`);
      await assert.rejects(
        api("POST", "/v1/sandboxes", { snapshot_tag: tag, network: { mode: "user" } }),
        (e: unknown) => e instanceof ApiError && e.status === 400,
      );
    } finally {
      await api("DELETE", `/v1/snapshots/${tag}`).catch(() => undefined);
    }
  },
);

step("bad network requests are refused with the field named", async () => {
  for (const [network, re] of [
    [{ mode: "netns", egress: { mode: "list", allow: [{ cidr: "10.0.0.1/8" }] } }, /host bits set/],
    [{ mode: "netns", expose: [70000] }, /expose/],
    [{ mode: "none", expose: [80] }, /cannot expose/],
    [{ mode: "bridge" }, /mode/],
    [{ mode: "netns", egress: { mode: "deny", dns: true } }, /answers no DNS/],
  ] as const) {
    await assert.rejects(
      api("POST", "/v1/sandboxes", { snapshot_tag: TAG, network }),
      (e: unknown) => e instanceof ApiError && e.status === 400 && re.test(e.message),
    );
  }
});

step("killed children give their slots back: rules emptied, slots reused", async () => {
  const id = instanceId(d.dataDir, {});
  const table = `forkd_${id}`;
  const namespaces = async () =>
    (await run("ip", ["netns", "list"])).stdout.split("\n").filter((l) => l.startsWith(`forkd-${id}-`))
      .length;
  const used = await Promise.all(["a", "b", "c"].map(async (n) => (await slotAddr(sid(n))).index));
  const chain = async (i: number) => (await run("nft", ["list", "chain", "inet", table, `s${i}`])).stdout;
  for (const i of used) assert.match(await chain(i), /accept/, `slot ${i} has its policy`);
  for (const n of ["a", "b", "c", "u", "n"]) await api("DELETE", `/v1/sandboxes/${sid(n)}`);
  const before = await namespaces();
  for (const i of used) {
    await waitFor(`slot ${i} emptied`, async () => (/accept/.test(await chain(i)) ? null : true), 30_000);
  }
  const again = await spawnOne("again", { mode: "netns", egress: { mode: "deny" } });
  assert.equal(await namespaces(), before, "recycled slots serve new children: none was added");
  const r = await probe(again.id, [`${OUTSIDE}:${ALLOWED_PORT}`]);
  assert.match(r.get(`${OUTSIDE}:${ALLOWED_PORT}`) ?? "", /^FAIL/, "the new policy, not the old one");
});

step(
  "user mode with egress allow runs in a slot: the outside is reachable, the host's loopback is not",
  async () => {
    // Port 80 too: slirp listens on it at the slot's address, as the VMM's unprivileged uid.
    const ua = await spawnOne("ua", { mode: "user", egress: { mode: "allow", dns: false }, expose: [80] });
    assert.equal(ua.network.mode, "user");
    await startGuestServer(sid("ua"), 80);
    const low = ua.network.ports.find((p) => p.port === 80)?.host ?? "";
    assert.equal(await waitFor("ua's port 80", () => readLine(low)), `guest ${sid("ua")}`);
    // slirp alone would map 10.0.2.2 to the host's loopback; in a slot it is the slot's own.
    const r = await probe(sid("ua"), [`${OUTSIDE}:${ALLOWED_PORT}`, `10.0.2.2:${hostServicePort}`]);
    assert.equal(r.get(`${OUTSIDE}:${ALLOWED_PORT}`), "OPEN allowed-server");
    assert.match(r.get(`10.0.2.2:${hostServicePort}`) ?? "", /^FAIL/);
    // Exposed while it runs: a slirp forward at the slot's address, the slot's table, a relay.
    await startGuestServer(sid("ua"));
    const v = await api<View>("POST", `/v1/sandboxes/${sid("ua")}/ports`, { port: 8000 });
    const host = v.network.ports.find((p) => p.port === 8000)?.host ?? "";
    assert.equal(await waitFor("ua's late port", () => readLine(host)), `guest ${sid("ua")}`);
    await api("DELETE", `/v1/sandboxes/${sid("ua")}`);
  },
);

step(
  "after kill -9 the daemon re-adopts a child with its slot, rules and exposed port; strays go",
  async () => {
    const k = await spawnOne("k", { mode: "netns", egress: { mode: "deny" }, expose: [8000] });
    await startGuestServer(sid("k"));
    const host = k.network.ports[0]?.host ?? "";
    assert.equal(await waitFor("k's server", () => readLine(host)), `guest ${sid("k")}`);
    // And one exposed while it runs, which the record keeps.
    await startGuestServer(sid("k"), 8001);
    const late =
      (await api<View>("POST", `/v1/sandboxes/${sid("k")}/ports`, { port: 8001 })).network.ports.find(
        (p) => p.port === 8001,
      )?.host ?? "";
    assert.equal(await waitFor("k's late port", () => readLine(late)), `guest ${sid("k")}`);
    const id = instanceId(d.dataDir, {});
    // A half-made slot, as a crash while creating one would leave.
    const stray = `forkd-${id}-63`;
    await run("ip", ["netns", "add", stray]);
    await d.kill9();
    assert.equal(await readLine(host, 2_000), null, "the relay died with the daemon");
    await d.start();
    assert.equal(await waitFor("k's relay", () => readLine(host)), `guest ${sid("k")}`);
    assert.equal(await waitFor("k's late relay", () => readLine(late)), `guest ${sid("k")}`);
    const view = await api<View>("GET", `/v1/sandboxes/${sid("k")}`);
    assert.deepEqual(view.network.ports, [
      { port: 8000, host },
      { port: 8001, host: late },
    ]);
    const r = await probe(sid("k"), [`${OUTSIDE}:${ALLOWED_PORT}`]);
    assert.match(r.get(`${OUTSIDE}:${ALLOWED_PORT}`) ?? "", /^FAIL/, "still egress deny");
    const names = (await run("ip", ["netns", "list"])).stdout;
    assert.doesNotMatch(names, new RegExp(`^${stray}\\b`, "m"));
    await api("DELETE", `/v1/sandboxes/${sid("k")}`);
  },
);

step(
  "only the operator opens a host address (FORKD_NET_HOST_ALLOW), to sandboxes whose policy names it",
  async () => {
    const service = `${OUTSIDE_GW}:${hostServicePort}`;
    const published = `${OUTSIDE_GW}:${PUBLISHED_PORT}`;
    const own = await slotAddr(sid("h"));
    const notOpened = [`${LATE_HOST_IP}:${hostServicePort}`, `${own.hostAddr}:${hostServicePort}`];
    await d.kill9();
    d.env.FORKD_NET_HOST_ALLOW = `${OUTSIDE_GW}:${hostServicePort},${PUBLISHED_PORT}`;
    await d.start();
    // h (re-adopted) lists OUTSIDE_GW/32 and 0.0.0.0/0 on both ports (the step above).
    let r = await probe(sid("h"), [service, published, ...notOpened]);
    assert.equal(r.get(service), "OPEN host-service");
    assert.equal(
      r.get(published),
      "OPEN allowed-server",
      "the published port, opened on its original address",
    );
    for (const t of notOpened) assert.match(r.get(t) ?? "", /^FAIL/, `${t}: not opened by the operator`);
    // The tenant's policy still decides for its sandbox: a list without the host, then allow.
    await api<View>("POST", `/v1/sandboxes/${sid("h")}/egress`, {
      mode: "list",
      allow: [{ cidr: `${OUTSIDE}/32`, ports: [ALLOWED_PORT] }],
    });
    r = await probe(sid("h"), [service, published]);
    for (const [t, res] of r) assert.match(res, /^FAIL/, `${t}: not in h's list`);
    await api<View>("POST", `/v1/sandboxes/${sid("h")}/egress`, { mode: "allow" });
    r = await probe(sid("h"), [service, ...notOpened]);
    assert.equal(r.get(service), "OPEN host-service");
    for (const t of notOpened) assert.match(r.get(t) ?? "", /^FAIL/, `${t} under egress allow`);
  },
);
