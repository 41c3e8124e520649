/** The console session: who is logged in, and logging in with an API token (the daemon's own listener). */
import { api, request } from "./http";

export interface Caller {
  caller: Record<string, unknown> & { kind?: string };
}

export const whoami = () => api<Caller>("GET", "/v1/console/session");
export const login = (token: string) => api<Caller>("POST", "/v1/console/session", { token });
export const logout = async () => void (await request("DELETE", "/v1/console/session"));
