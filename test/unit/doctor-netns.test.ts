/**
 * `forkd doctor`'s netns line names the real cause and its own fix: a missing jailer is "make -C
 * native", not "run the daemon as root"; a command that needs root is asked for through `su -c`
 * when the doctor is not root (a fresh Debian has no sudo), as it is when it is; sudo never.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { netnsVerdict } from "../../src/net/capability.js";
import { asRoot } from "../../src/util/as-root.js";

const ready = { root: true, jailer: "/x/forkd-jailer", missingTools: [], tun: true };

test("netns: ready is ok with no fix", () => {
  const v = netnsVerdict(ready);
  assert.equal(v.ok, true);
  assert.equal(v.fix, undefined);
});

test("netns: root but no jailer built: the jailer is the cause, and make -C native the fix", () => {
  const v = netnsVerdict({ ...ready, jailer: null });
  assert.equal(v.ok, false);
  assert.match(v.reason, /no jailer/);
  assert.doesNotMatch(v.reason, /not root/);
  assert.match(v.fix ?? "", /make -C native/);
  assert.doesNotMatch(v.fix ?? "", /as root|sudo|setup-host/);
});

test("netns: every cause named, each with its own fix; root's commands without sudo", () => {
  const v = netnsVerdict({ root: false, jailer: null, missingTools: ["nft (nftables)"], tun: false });
  assert.equal(v.ok, false);
  for (const why of [/not root/, /no jailer/, /missing nft \(nftables\)/, /\/dev\/net\/tun/])
    assert.match(v.reason, why);
  assert.match(v.fix ?? "", /run the daemon as root/);
  assert.match(v.fix ?? "", /make -C native/);
  assert.match(v.fix ?? "", /su -c 'bash scripts\/setup-host\.sh'/);
  assert.match(v.fix ?? "", /modprobe tun/);
  assert.doesNotMatch(v.fix ?? "", /sudo/);
  const asRootAlready = netnsVerdict({ ...ready, missingTools: ["ip (iproute2)"] });
  assert.match(asRootAlready.fix ?? "", /install them: bash scripts\/setup-host\.sh$/);
});

test("asRoot: as it is for root, through su -c otherwise", () => {
  assert.equal(asRoot("bash scripts/setup-host.sh", true), "bash scripts/setup-host.sh");
  assert.equal(asRoot("bash scripts/setup-host.sh", false), "su -c 'bash scripts/setup-host.sh'");
});
