// Lint: typescript-eslint's type-aware recommended rules over sources, tests and benchmarks.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

const CHILD_ENV = {
  selector:
    "CallExpression[callee.name=/^(spawn|spawnSync|execFile|execFileSync|exec|execSync|fork)$/]:not(:has(Property[key.name='env']))",
  message: "pass an explicit `env` (childEnv(...) from src/util/proc.ts) to every child process",
};
const NO_MODULE_LET = [
  "Program > VariableDeclaration",
  "Program > ExportNamedDeclaration > VariableDeclaration",
].map((at) => ({
  selector: `${at}[kind=/^(let|var)$/]`,
  message: "no module-level mutable state: keep it in the object that owns it",
}));

export default tseslint.config(
  {
    ignores: [
      "**/dist/",
      "node_modules/",
      "guest/",
      "sdk/python/",
      "**/*.gen.ts",
      "src/e2b/envd/gen/",
      "**/*.js",
      "**/*.mjs",
    ],
  },
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
    // No module-level mutable state: a `let` or `var` at the top of a module is refused (state
    // lives in the objects that own it and is passed in).
    files: ["src/**/*.ts"],
    rules: { "no-restricted-syntax": ["error", CHILD_ENV, ...NO_MODULE_LET] },
  },
  {
    // The web console's front end (console/, its own tsconfig with the DOM lib): no module-level
    // mutable state there either (state lives in components and hooks).
    files: ["console/src/**/*.ts", "console/src/**/*.tsx"],
    rules: { "no-restricted-syntax": ["error", ...NO_MODULE_LET] },
  },
);
