// Browser tests: Debian's headless Chromium (no browser download), the built app served by
// tools/serve.mjs with the exports of tools/make_test_exports.py (WEB_TEST_EXPORTS): the
// classifier and the tagger (models/0 and models/1, the order of reference.json's exports),
// then the toy translation export (the Translate tab) and the toy language model export (the
// Generate tab).
import { defineConfig } from "@playwright/test";

const PORT = Number(process.env.WEB_TEST_PORT ?? 8765);
const EXPORTS = process.env.WEB_TEST_EXPORTS ?? "";
const exportDirs = EXPORTS
  ? ["sentiment/export", "entities/export", "translation/export", "generation/export"].map((d) => `${EXPORTS}/${d}`).join(",")
  : "";

export default defineConfig({
  testDir: "e2e",
  timeout: 180_000,
  workers: 1,
  reporter: [["list"]],
  use: {
    baseURL: `http://127.0.0.1:${PORT}/`,
    launchOptions: {
      executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium-headless-shell",
      args: ["--no-sandbox"],
    },
  },
  webServer: {
    command: `node tools/serve.mjs --host 127.0.0.1 --port ${PORT}${exportDirs ? ` --export ${exportDirs}` : ""}`,
    url: `http://127.0.0.1:${PORT}/models/index.json`,
    reuseExistingServer: false,
    timeout: 30_000,
  },
});
