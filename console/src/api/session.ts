/** The console session: who is logged in, and logging in with an API token (the daemon's own listener). */
import { api, request } from "./http";
import type { ConsoleCaller } from "./types";

export const whoami = () => api<ConsoleCaller>("GET", "/v1/console/session");
export const login = (token: string) => api<ConsoleCaller>("POST", "/v1/console/session", { token });
export const logout = async () => void (await request("DELETE", "/v1/console/session"));
