/**
 * What vmm offers: the VMM interfaces (driver, VM) and their QEMU implementation over QMP, the
 * accelerator and QEMU binary, the jail every VMM and host tool runs in, memory snapshots, and the
 * doctor's checks. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { chooseAccel } from "./accel.js";
export type { AccelChoice } from "./accel.js";
export { defaultCpu, kernelCmdline, vmFiles } from "./config.js";
export type { MachineConfig } from "./config.js";
export { runChecks } from "./doctor.js";
export type { VmmDriver } from "./driver.js";
export { takeVmmFile } from "./jail-files.js";
export { claimUidRange, jailGid } from "./jail-uids.js";
export { Jail, hideRoots, jailEnabled, jailOptions } from "./jail.js";
export { JailedTools, runTool } from "./jailed-tools.js";
export type { ToolRunner } from "./jailed-tools.js";
export { limitsFor } from "./limits.js";
export { LIVE_MIN_BYTES, forkdLiveCapture, parseLiveMode } from "./live-capture.js";
export type { LiveCapture, LiveCapturer, LiveMode } from "./live-capture.js";
export { forkdMemsnap } from "./memsnap.js";
export type { Capture, CaptureStats, MemoryDiffs } from "./memsnap.js";
export { findQemu, qemuVersion } from "./qemu-binary.js";
export { QemuDriver } from "./qemu.js";
export { Strays } from "./strays.js";
export type { StrayProcess } from "./strays.js";
export type { Vm } from "./vm.js";
