/** Integration tests as ordered steps that remember whether one failed (to keep its artefacts). */
import { test } from "node:test";

export function steps(): { step: (name: string, fn: () => Promise<void>) => void; failed: () => boolean } {
  let failed = false;
  return {
    step: (name, fn) =>
      void test(name, async () => {
        try {
          await fn();
        } catch (e) {
          failed = true;
          throw e;
        }
      }),
    failed: () => failed,
  };
}
