/** The host page's sources: health (accelerator, pools, network slots) and the Prometheus exposition. */
import { api, apiText } from "./http";
import type { Health } from "./types";

export const health = () => api<Health>("GET", "/v1/health");
export const metricsText = () => apiText("/metrics");
