import assert from "node:assert/strict";
import { test } from "node:test";

import { defaultCpu, guestMitigations, kernelCmdline } from "../../src/vmm/config.js";

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
