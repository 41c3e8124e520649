/**
 * `forkd push` / `forkd pull`: the daemon does the transfer (POST …/push, POST /v1/snapshots/pull
 * with ?stream=1); this prints its progress lines and returns the result.
 */
import { ApiError, checkResponse, rawRequest, readNdjson } from "../client/http.js";
import type { Endpoint } from "../client/http.js";
import { PROGRESS_IDLE_MS } from "./timeouts.js";

interface TransferEvent<T> {
  type: string;
  message?: string;
  result?: T;
  error?: { code: string; message: string; details: Record<string, unknown> };
}

export async function streamTransfer<T>(
  ep: Endpoint,
  path: string,
  body: unknown,
  say: (line: string) => void,
): Promise<T> {
  const t0 = Date.now();
  const res = await checkResponse(
    await rawRequest(ep, "POST", `${path}?stream=1`, JSON.stringify(body), PROGRESS_IDLE_MS, {
      "content-type": "application/json",
    }),
  );
  let result: T | undefined;
  await readNdjson(res, (ev: TransferEvent<T>) => {
    if (ev.type === "progress") say(`  [${((Date.now() - t0) / 1000).toFixed(1)}s] ${ev.message ?? ""}`);
    else if (ev.type === "done") result = ev.result;
    else if (ev.type === "error") {
      const code = ev.error?.code ?? "internal";
      throw new ApiError(
        code === "invalid_argument" ? 400 : 500,
        code,
        ev.error?.message ?? "failed",
        ev.error?.details ?? {},
      );
    }
  });
  if (result === undefined)
    throw new ApiError(500, "internal", "the daemon ended the stream without a result");
  return result;
}

export const mib = (n: number): string => `${(n / 2 ** 20).toFixed(1)} MiB`;
