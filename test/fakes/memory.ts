/**
 * Fake private-page capture for fake VMMs (forkd-memsnap reads /proc/PID/mem, which a fake has
 * not): the "diff" names the VMM and its guest; applying it writes base + diff. Capturing from
 * a VMM that is gone fails, as memsnap does.
 */
import { appendFile, copyFile, readFile, writeFile } from "node:fs/promises";
import { ForkdError } from "../../src/util/errors.js";
import type { Capture, MemoryDiffs } from "../../src/vmm/memsnap.js";
import type { FakeHost } from "./vmm.js";

export function fakeMemory(host: FakeHost): MemoryDiffs {
  return {
    async capture(pid, _memfile, diff): Promise<Capture> {
      await host.faults.hit("capture", pid);
      if (!host.process(pid))
        throw new ForkdError("vmm_error", `memory capture start failed: no process ${pid}`);
      let done: () => void = () => undefined;
      let failed: (e: Error) => void = () => undefined;
      const written = new Promise<void>((resolve, reject) => {
        done = resolve;
        failed = reject;
      });
      written.catch(() => undefined);
      return {
        async go() {
          const p = host.process(pid);
          if (!p) {
            const e = new ForkdError("vmm_error", `memory capture copy failed: process ${pid} is gone`);
            failed(e);
            throw e;
          }
          const body = JSON.stringify({ pid, guest: p.guest?.name ?? null });
          await writeFile(diff, body);
          done();
          return { pages: 1, bytes: body.length, runs: 1, scan_ms: 0, copy_ms: 0 };
        },
        written,
        kill: () => failed(new ForkdError("vmm_error", "memory capture killed")),
      };
    },
    async apply(base, diff, out) {
      await host.faults.hit("apply", null);
      await copyFile(base, out);
      await appendFile(out, await readFile(diff));
    },
    async inject(pid, _memfile, diff) {
      // A fake guest's memory is not modelled: the diff must exist and the VMM be there.
      await readFile(diff);
      if (!host.process(pid)) throw new ForkdError("vmm_error", `memory inject failed: no process ${pid}`);
    },
  };
}
