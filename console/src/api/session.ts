/**
 * The console session: who is logged in; logging in (with the one-time secret `forkd console`
 * printed, or an API token on the daemon's own listener), which keeps the reply's key for this
 * tab; logging out.
 */
import { api, request, setSessionKey } from "./http";
import type { ConsoleCaller } from "./types";

type LoggedIn = ConsoleCaller & { key: string };

export const whoami = () => api<ConsoleCaller>("GET", "/v1/console/session");

async function open(body: { token: string } | { secret: string }): Promise<ConsoleCaller> {
  const r = await api<LoggedIn>("POST", "/v1/console/session", body);
  setSessionKey(r.key);
  return r;
}

export const login = (token: string) => open({ token });
export const loginWithSecret = (secret: string) => open({ secret });
export const logout = async () => {
  try {
    await request("DELETE", "/v1/console/session");
  } finally {
    setSessionKey(null);
  }
};
