import assert from "node:assert/strict";
import { test } from "node:test";

import { defaultCpu, guestMitigations, kernelCmdline, qemuArgs } from "../../src/vmm/config.js";
import type { VmLaunch } from "../../src/vmm/config.js";

test("TCG guests boot without mitigations by default; KVM guests keep them", () => {
  const tcg = kernelCmdline("tcg", 2_000_000, {}).split(" ");
  assert.ok(tcg.includes("mitigations=off"));
  assert.ok(tcg.includes("tsc_early_khz=2000000"));
  const kvm = kernelCmdline("kvm", 2_000_000, {}).split(" ");
  assert.ok(!kvm.includes("mitigations=off"));
  assert.ok(!kvm.some((a) => a.startsWith("tsc_early_khz")));
});

test("FORKD_GUEST_MITIGATIONS overrides the default and rejects other values", () => {
  assert.equal(guestMitigations("tcg", { FORKD_GUEST_MITIGATIONS: "on" }), true);
  assert.equal(guestMitigations("kvm", { FORKD_GUEST_MITIGATIONS: "off" }), false);
  assert.ok(!kernelCmdline("tcg", 1, { FORKD_GUEST_MITIGATIONS: "on" }).includes("mitigations"));
  assert.throws(() => guestMitigations("tcg", { FORKD_GUEST_MITIGATIONS: "maybe" }), /on, off or auto/);
});

test("the CPU model is Intel-identified under TCG, host under KVM, and overridable", () => {
  assert.match(defaultCpu("tcg", {}), /^Nehalem/);
  assert.equal(defaultCpu("kvm", {}), "host");
  assert.equal(defaultCpu("tcg", { FORKD_CPU: "qemu64" }), "qemu64");
});

const launch = (incoming: boolean, accel: "tcg" | "kvm" = "tcg"): VmLaunch => ({
  dir: "/run/vm",
  machine: { memoryMiB: 256, vcpus: 1, accel, cpu: defaultCpu(accel, {}) },
  memory: { path: "/snap/memory", mode: incoming ? "child" : "parent" },
  disk: "/run/vm/disk.qcow2",
  incoming,
});

test("children restored from a snapshot do not announce themselves after the load, under TCG and KVM", () => {
  for (const accel of ["tcg", "kvm"] as const) {
    const child = qemuArgs(launch(true, accel));
    const i = child.indexOf("migration.announce-rounds=0");
    assert.ok(i > 0 && child[i - 1] === "-global", `${accel}: ${child.join(" ")}`);
    // A parent boots and never loads a stream: nothing to announce.
    assert.ok(!qemuArgs(launch(false, accel)).includes("migration.announce-rounds=0"));
  }
});
