// Lint: typescript-eslint's type-aware recommended rules over sources, tests and benchmarks.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["**/dist/", "node_modules/", "guest/", "sdk/python/", "**/*.gen.ts", "**/*.js", "**/*.mjs"] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/no-floating-promises": [
        "error",
        {
          allowForKnownSafeCalls: [
            { from: "package", package: "node:test", name: ["test", "describe", "it"] },
          ],
        },
      ],
      "@typescript-eslint/consistent-type-imports": "error",
      "@typescript-eslint/require-await": "off",
      eqeqeq: ["error", "always"],
    },
  },
  {
    // A child process never inherits the daemon's environment by accident (FORKD_TOKEN, registry
    // credentials): every spawn/execFile in src/ says what its child gets (src/util/proc.ts childEnv).
    files: ["src/**/*.ts"],
    rules: {
      "no-restricted-syntax": [
        "error",
        {
          selector:
            "CallExpression[callee.name=/^(spawn|spawnSync|execFile|execFileSync|exec|execSync|fork)$/]:not(:has(Property[key.name='env']))",
          message: "pass an explicit `env` (childEnv(...) from src/util/proc.ts) to every child process",
        },
      ],
    },
  },
);
