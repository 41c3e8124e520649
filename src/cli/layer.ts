/**
 * `forkd snapshot --from T --tag T2 --exec CMD`: a chain layer built through the API: fork one
 * child of T, run CMD in it (output streamed), branch it as T2, kill it. A failing CMD leaves
 * no snapshot behind.
 */
import { apiRequest, checkResponse, rawRequest, readNdjson } from "../client/http.js";
import type { Endpoint } from "../client/http.js";
import { CALL_MS, HEAVY_MS, execIdleMs } from "./timeouts.js";

export async function snapshotLayer(
  ep: Endpoint,
  o: { from: string; tag: string; exec: string; json: boolean },
  say: (s: string) => void,
): Promise<number> {
  const t0 = Date.now();
  const fork = await apiRequest<{ sandboxes: { id: string }[]; failures: { message: string }[] }>(
    ep,
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: o.from, n: 1 },
    HEAVY_MS,
  );
  const id = fork.sandboxes[0]?.id;
  if (!id) throw new Error(`could not fork ${o.from}: ${fork.failures[0]?.message ?? "unknown"}`);
  try {
    say(`forkd: building ${o.tag} on ${o.from} in ${id}: ${o.exec}`);
    const res = await checkResponse(
      await rawRequest(
        ep,
        "POST",
        `/v1/sandboxes/${id}/exec/stream`,
        JSON.stringify({ cmd: o.exec }),
        execIdleMs(),
        {
          "content-type": "application/json",
        },
      ),
    );
    let exit: { exit_code: number | null; signal: number | null } | null = null;
    await readNdjson(
      res,
      (ev: { type: string; data?: string; exit_code?: number | null; signal?: number | null }) => {
        if (ev.type === "stdout" || ev.type === "stderr")
          process.stderr.write(Buffer.from(ev.data ?? "", "base64"));
        else if (ev.type === "exit") exit = { exit_code: ev.exit_code ?? null, signal: ev.signal ?? null };
      },
    );
    const e = exit as { exit_code: number | null; signal: number | null } | null;
    if (!e || e.exit_code !== 0) {
      say(
        `forkd: the command failed (${e ? `exit ${e.exit_code ?? `signal ${e.signal}`}` : "no exit"}); no snapshot made`,
      );
      return 1;
    }
    const b = await apiRequest<{ tag: string; pause_ms: number; snapshot: unknown }>(
      ep,
      "POST",
      `/v1/sandboxes/${id}/branch`,
      { tag: o.tag, wait: true },
      HEAVY_MS,
    );
    if (o.json) console.log(JSON.stringify(b.snapshot, null, 2));
    else console.log(`snapshot ${b.tag} ready (layer on ${o.from}): ${Date.now() - t0} ms`);
    return 0;
  } finally {
    await apiRequest(ep, "DELETE", `/v1/sandboxes/${id}`, undefined, CALL_MS).catch(() => undefined);
  }
}
