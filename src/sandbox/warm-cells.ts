/**
 * The cells a hot pool member runs in a throwaway code context of each warm kernel (pool-warm.ts),
 * so that TCG has translated what a child's first cells execute before a fork takes the member.
 * Translation is per QEMU process and is most of a fresh child's first cell under TCG (a numpy
 * cell that takes 17 ms once translated takes 130-300 ms the first time), so the Python cell also
 * runs the common numpy paths when the snapshot's kernel has numpy imported: array creation,
 * arithmetic and comparisons, reductions, sorting, indexing, the Generator's distributions,
 * small linear algebra and repr (a numpy without one of them, say older than 1.17, only skips
 * the rest: a warm-up that raised would leave the pool cold). It leaves nothing a user could see: it names only the context's
 * own globals (the context is deleted after it), draws only from a Generator of its own (never
 * numpy's or Python's global generators, which the fork's identity reseeds anyway), changes no
 * numpy setting, and drops its own source from linecache. Its last expression is 42.
 */
import type { EvalLanguage } from "../agent/index.js";

/** numpy's common paths, on small arrays (what is translated depends on the code run, not on n). */
const NUMPY_PATHS = [
  "if 'numpy' in __import__('sys').modules:",
  "    try:",
  "        _np = __import__('sys').modules['numpy']",
  "        _g = _np.random.default_rng(0)",
  "        for _n in (7, 1000, 20_000):",
  "            _x = _g.standard_normal(_n)",
  "            _u = _g.random(_n)",
  "            _i = _g.integers(0, 100, _n)",
  "            _g.normal(1.0, 2.0, _n); _g.uniform(0, 1, _n); _g.choice(_i, 3); _g.permutation(_i)",
  "            float(_x.mean() + _x.std() + _x.var() + _x.sum() + _x.min() + _x.max() + _u.prod())",
  "            int(_i.argmax() + _i.argmin() + _i.sum()); _np.median(_x); _np.percentile(_u, 90)",
  "            _y = (_x * 2.0 + 1.0 - _u) / 3.0; _np.sqrt(_np.abs(_y)); _np.exp(-_u); _np.log1p(_u)",
  "            _x[_x > 0]; _x[::2]; _x[_i % _n]; _np.where(_x > 0, _x, 0.0); (_x > 0).sum(); _x.round(2)",
  "            _np.sort(_x); _np.argsort(_i); _np.unique(_i); _np.cumsum(_u); _np.diff(_u)",
  "            _x.astype(_np.float32); _i.astype(float); _np.isnan(_x).any(); _np.allclose(_x, _x)",
  "        _a = _np.arange(1000).reshape(10, 100)",
  "        _a.T.copy(); _a.sum(axis=0); _a.mean(axis=1); _a.reshape(-1); _np.concatenate([_a, _a])",
  "        _np.stack([_a, _a]); _np.linspace(0.0, 1.0, 50); _np.zeros((3, 4)); _np.ones(5); _np.full(3, 7)",
  "        _m = _g.standard_normal((32, 32))",
  "        _m @ _m; _np.dot(_m, _m[0]); _np.linalg.inv(_m + 32 * _np.eye(32)); _np.linalg.norm(_m)",
  "        _np.linalg.solve(_m + 32 * _np.eye(32), _m[0]); _np.outer(_m[0], _m[1]); _m.T @ _m[:, 0]",
  "        repr(_a); str(_m[:2]); repr(_x[:5]); _x.tolist()[:3]; _np.array([[1, 2], [3, 4]], dtype=float)",
  "    except Exception:",
  "        pass",
].join("\n");

/** The warm-up cell of `language` for context `id` (its first cell: Python files it as `<cell ID8:1>`). */
export const WARM_CELLS: Record<EvalLanguage, (id: string) => string> = {
  python: (id) =>
    `__import__("linecache").cache.pop("<cell ${id.slice(0, 8)}:1>", None)\n${NUMPY_PATHS}\n6 * 7`,
  javascript: () => "[1, 2, 3].map((x) => x * 2).length * 14",
};
