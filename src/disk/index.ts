/**
 * What disk offers: qcow2 layers (overlays, plain layers, backing chains) made and read by jailed
 * host tools. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export {
  cloneOverlay,
  convertToRaw,
  createOverlay,
  flattenLayers,
  rawSize,
  rebaseUnsafe,
} from "./overlay.js";
export { plainLayerProblem } from "./plain-layer.js";
