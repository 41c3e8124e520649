/**
 * Strays (src/vmm/strays.ts) among a fake host's VMM processes instead of /proc: what recovery
 * kills when a sandbox cannot be adopted is the fake VMM that runs from its directory.
 */
import type { StrayLogger, StrayProcess } from "../../src/vmm/strays.js";
import { Strays } from "../../src/vmm/strays.js";
import type { FakeHost } from "./vmm.js";

export class FakeStrays extends Strays {
  constructor(
    private readonly host: FakeHost,
    private readonly logger: StrayLogger,
  ) {
    super([], logger);
  }

  override list(): Promise<StrayProcess[]> {
    return Promise.resolve(
      this.host.processes().map((p) => ({
        pid: p.id.pid,
        startTime: p.id.startTime,
        exe: "/nonexistent/forkd-fake-vmm",
        args: ["-qmp", `unix:${p.dir}/qmp.sock`, "-drive", `file=${p.launch.disk}`],
      })),
    );
  }

  override async kill(needles: string[], why: string, among?: StrayProcess[]): Promise<number[]> {
    const killed: number[] = [];
    for (const s of among ?? (await this.list())) {
      if (!s.args.some((a) => needles.some((n) => a.includes(n)))) continue;
      const p = this.host.process(s.pid);
      if (!p || p.id.startTime !== s.startTime) continue;
      this.logger.warn("killing a process a dead daemon left behind", { pid: s.pid, why });
      await p.end();
      killed.push(s.pid);
    }
    return killed;
  }
}
