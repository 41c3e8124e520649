/**
 * What archive offers: reading tar streams under bounds (untrusted packs, image layers, build
 * contexts). Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { staysInside } from "./tar-fields.js";
export { CONTEXT_TAR, PACK_TAR, layerTar } from "./tar-profiles.js";
export { TarReader } from "./tar-reader.js";
export type { TarEntry, TarSink } from "./tar-reader.js";
