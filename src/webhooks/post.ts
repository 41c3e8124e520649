/**
 * One delivery attempt: a POST of a JSON body with a deadline for the whole exchange (connect,
 * send, the reply's status line): a receiver that accepts and never answers is cut off at the
 * deadline and holds nothing after it; `signal` ends it sooner. The reply's body is not read. Redirects are not followed
 * (a 3xx is a failure). `lookup`: the connection's address check (a tenant's webhook may reach
 * only public addresses: src/registry/reach.ts).
 */
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import type { LookupFunction } from "node:net";
import { errorMessage } from "../util/index.js";

export interface PostResult {
  ok: boolean;
  /** The reply's status (absent: no reply). */
  status?: number;
  /** Why it failed, for the webhook's state (no secrets in it). */
  error?: string;
}

export function postOnce(
  url: URL,
  headers: Record<string, string>,
  body: string,
  o: { timeoutMs: number; lookup?: LookupFunction; signal?: AbortSignal },
): Promise<PostResult> {
  return new Promise<PostResult>((resolve) => {
    let done = false;
    const finish = (r: PostResult) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(r);
    };
    const data = Buffer.from(body);
    const request = url.protocol === "https:" ? httpsRequest : httpRequest;
    let req: ReturnType<typeof httpRequest>;
    try {
      req = request(url, {
        method: "POST",
        agent: false,
        headers: { ...headers, "content-type": "application/json", "content-length": String(data.length) },
        ...(o.lookup ? { lookup: o.lookup } : {}),
      });
    } catch (e) {
      finish({ ok: false, error: errorMessage(e) });
      return;
    }
    const timer = setTimeout(() => {
      finish({ ok: false, error: `no answer within ${o.timeoutMs} ms` });
      req.destroy();
    }, o.timeoutMs);
    // The daemon stopping: the attempt ends now (its event stays queued).
    const abort = () => {
      finish({ ok: false, error: "aborted: the daemon is stopping" });
      req.destroy();
    };
    if (o.signal?.aborted) return abort();
    o.signal?.addEventListener("abort", abort, { once: true });
    req.on("close", () => o.signal?.removeEventListener("abort", abort));
    req.on("response", (res) => {
      const status = res.statusCode ?? 0;
      res.destroy();
      req.destroy();
      finish(
        status >= 200 && status < 300
          ? { ok: true, status }
          : { ok: false, status, error: `answered ${status}` },
      );
    });
    req.on("error", (e) => finish({ ok: false, error: errorMessage(e) }));
    req.end(data);
  });
}
