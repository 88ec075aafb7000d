import { defineConfig } from "vitest/config";

// Unit and golden-parity tests of the pure core (src/lib/core), in Node. The golden test
// writes fresh golden vectors with the project's Python unless GOLDEN_ROOT names them
// (test/golden.ts); the browser tests (e2e/) run with Playwright, not here.
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    environment: "node",
    testTimeout: 120_000,
    hookTimeout: 600_000,
  },
});
