/** The warm pool as GET /v1/health shows it (`pool_state`, admins only). */
import type { PoolState } from "../../sandbox/index.js";

export function poolStateView(p: PoolState) {
  return {
    total: p.total,
    hot: p.hot,
    cold: p.cold,
    max: p.max,
    max_mib: p.maxMiB,
    memory_mib: p.memMiB,
    tags: p.tags,
  };
}
