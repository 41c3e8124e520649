/**
 * Same-origin calls to the daemon's API: the session cookie goes along with the session's key
 * (kept in this tab's sessionStorage, which no other origin reads: the cookie alone, which the
 * browser also sends to the host's other ports, opens nothing), every request carries the
 * console's CSRF header, and an error reply becomes an ApiError with the wire's code. What cannot
 * send a header (EventSource, WebSocket, a download link) gets a single-use ticket for its URL.
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

export const CONSOLE_HEADER = { "X-Forkd-Console": "1" } as const;
const KEY_STORE = "forkd_console_key";

/** The session's key, from the login's reply (null: not logged in in this tab). */
export function sessionKey(): string | null {
  try {
    return sessionStorage.getItem(KEY_STORE);
  } catch {
    return null;
  }
}

export function setSessionKey(key: string | null): void {
  try {
    if (key === null) sessionStorage.removeItem(KEY_STORE);
    else sessionStorage.setItem(KEY_STORE, key);
  } catch {
    /* storage refused (a private mode): the next call answers 401 and the login page shows */
  }
}

function credentialHeaders(): Record<string, string> {
  const key = sessionKey();
  return key === null ? { ...CONSOLE_HEADER } : { ...CONSOLE_HEADER, "X-Forkd-Console-Key": key };
}

export type Query = Record<string, string | number | boolean | undefined>;

export function withQuery(path: string, query: Query = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined) q.set(k, String(v));
  const s = q.toString();
  return s === "" ? path : `${path}?${s}`;
}

/** One request; `body` is sent as JSON, or as bytes when it is a Blob. */
export async function request(
  method: string,
  path: string,
  body?: unknown,
  query?: Query,
): Promise<Response> {
  const headers: Record<string, string> = credentialHeaders();
  let payload: BodyInit | undefined;
  if (body instanceof Blob) {
    headers["Content-Type"] = "application/octet-stream";
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const res = await fetch(withQuery(path, query), {
    method,
    headers,
    credentials: "same-origin",
    ...(payload === undefined ? {} : { body: payload }),
  });
  if (!res.ok) throw await errorOf(res);
  return res;
}

export async function api<T>(method: string, path: string, body?: unknown, query?: Query): Promise<T> {
  const res = await request(method, path, body, query);
  return (await res.json()) as T;
}

/** `path` with a fresh single-use ticket (60 s) standing for the key, for a URL-only client. */
export async function withTicket(path: string, query: Query = {}): Promise<string> {
  const { ticket } = await api<{ ticket: string }>("POST", "/v1/console/ticket");
  return withQuery(path, { ...query, console_ticket: ticket });
}

export async function apiText(path: string, query?: Query): Promise<string> {
  return (await request("GET", path, undefined, query)).text();
}

async function errorOf(res: Response): Promise<ApiError> {
  const text = await res.text().catch(() => "");
  try {
    const j = JSON.parse(text) as { error?: { code?: string; message?: string } };
    return new ApiError(res.status, j.error?.code ?? "http_error", j.error?.message ?? `HTTP ${res.status}`);
  } catch {
    return new ApiError(res.status, "http_error", text.slice(0, 200) || `HTTP ${res.status}`);
  }
}

export function messageOf(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
