/**
 * The scale benchmark's HTTP client: node:http over one keep-alive agent (connections reused, as
 * an SDK's are), a bound on every call, the reply read whole and parsed as JSON when it is.
 */
import { Agent, request as httpRequest } from "node:http";

const agent = new Agent({ keepAlive: true, maxSockets: 256 });

export interface Reply<T> {
  status: number;
  body: T;
  ms: number;
}

export function request<T = Record<string, unknown>>(
  base: string,
  method: string,
  path: string,
  o: { token?: string; body?: unknown; timeoutMs?: number } = {},
): Promise<Reply<T>> {
  const body = o.body === undefined ? undefined : Buffer.from(JSON.stringify(o.body));
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      new URL(path, base),
      {
        method,
        agent,
        headers: {
          ...(o.token ? { authorization: `Bearer ${o.token}` } : {}),
          ...(body ? { "content-type": "application/json", "content-length": String(body.length) } : {}),
        },
        timeout: o.timeoutMs ?? 60_000,
      },
      (res) => {
        const parts: Buffer[] = [];
        res.on("data", (c: Buffer) => parts.push(c));
        res.on("error", reject);
        res.on("end", () => {
          const ms = performance.now() - t0;
          const text = Buffer.concat(parts).toString("utf8");
          let parsed: unknown = text;
          try {
            parsed = JSON.parse(text);
          } catch {
            /* not JSON: the text */
          }
          resolve({ status: res.statusCode ?? 0, body: parsed as T, ms });
        });
      },
    );
    req.on("timeout", () =>
      req.destroy(new Error(`${method} ${path}: no reply within ${o.timeoutMs ?? 60_000} ms`)),
    );
    req.on("error", reject);
    req.end(body);
  });
}
