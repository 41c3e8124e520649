/**
 * A fake live BRANCH capture (src/vmm/live-capture.ts) over the fake VMM: the migration is the
 * fake VM's (migrateRam ... migrationFinish, with its faults), the pages the fake memory's
 * capture, taken at the stop. For the branch's choice between live and stopped, and its failures.
 */
import type { LiveCapture, LiveCapturer } from "../../src/vmm/live-capture.js";
import type { MemoryDiffs } from "../../src/vmm/memsnap.js";

export function fakeLiveCapture(
  memory: () => MemoryDiffs,
  estimateBytes: () => number,
): LiveCapturer & { starts: number } {
  const live = {
    starts: 0,
    async start(vm, memfile, diff): Promise<LiveCapture> {
      live.starts++;
      let migrating = false;
      let capture: Awaited<ReturnType<MemoryDiffs["capture"]>> | null = null;
      let resolveWritten: (p: Promise<void>) => void = () => undefined;
      const written = new Promise<Promise<void>>((r) => (resolveWritten = r)).then((p) => p);
      written.catch(() => undefined);
      const abort = async () => {
        capture?.kill();
        resolveWritten(Promise.reject(new Error("aborted")));
        if (migrating) {
          migrating = false;
          await vm.migrationCancel(1_000);
        }
      };
      return {
        estimateBytes: estimateBytes(),
        async stopped() {
          migrating = true;
          await vm.migrateRam(`unix:${vm.dir}/fake-live.sock`);
          await vm.migrationStopped(1_000);
        },
        async go() {
          capture = await memory().capture(vm.pid, memfile, diff);
          const stats = await capture.go();
          await vm.migrationFinish(1_000);
          migrating = false;
          resolveWritten(capture.written);
          return stats;
        },
        written,
        kill: () => void abort(),
        abort,
      };
    },
  } satisfies LiveCapturer & { starts: number };
  return live;
}
