#!/usr/bin/env node
// Drives bench.html in a system Chromium for benchmarks/web_latency.py.
//
//   node bench/drive.mjs < plan.json > results.jsonl
//
// plan.json: {"chromium": "/usr/bin/chromium-headless-shell", "origin": "http://127.0.0.1:PORT",
//             "pages": [{"url": "...", "timeoutMs": 600000}, ...]}
// Each page opens in a fresh browser context (cold HTTP cache) and is awaited until it sets
// `window.benchResult` or `window.benchError`. Requests outside `origin` (MediaPipe's usage
// logger posts to a Google endpoint) are aborted and listed. Prints one JSON line per page
// ({url, result, error, blocked, requests: [{url, bytes}], consoleErrors, loadBefore,
// loadAfter: the 1-minute load average around the page}) and a last line
// {"chromium": version}. Progress goes to stderr.
import { loadavg } from "node:os";

import { chromium } from "@playwright/test";

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf-8"));
}

async function runPage(browser, origin, spec) {
  const context = await browser.newContext();
  const blocked = [];
  const requests = [];
  const sizes = [];
  const consoleErrors = [];
  await context.route((url) => url.origin !== origin, (route) => {
    blocked.push(`${route.request().method()} ${route.request().url()}`);
    return route.abort("blockedbyclient");
  });
  const page = await context.newPage();
  page.on("console", (message) => {
    if (message.type() === "error") consoleErrors.push(message.text());
    if (message.text().startsWith("[bench]")) process.stderr.write(`  ${message.text()}\n`);
  });
  page.on("pageerror", (error) => consoleErrors.push(`uncaught: ${error.message}`));
  page.on("requestfinished", (request) => {
    sizes.push(request.sizes().then((s) => requests.push({ url: request.url(), bytes: s.responseBodySize })));
  });
  let result = null;
  let error = null;
  const loadBefore = loadavg()[0];
  try {
    await page.goto(spec.url);
    await page.waitForFunction(() => window.benchResult !== undefined || window.benchError !== undefined,
      null, { timeout: spec.timeoutMs ?? 600_000, polling: 500 });
    [result, error] = await page.evaluate(() => [window.benchResult ?? null, window.benchError ?? null]);
  } catch (caught) {
    error = `driver: ${caught.message}`;
  }
  await Promise.allSettled(sizes);
  await context.close();
  return { url: spec.url, result, error, blocked, requests, consoleErrors, loadBefore,
    loadAfter: loadavg()[0] };
}

async function main() {
  const plan = await readStdin();
  const browser = await chromium.launch({ executablePath: plan.chromium, args: ["--no-sandbox"] });
  try {
    for (const spec of plan.pages) {
      process.stderr.write(`page ${spec.url}\n`);
      process.stdout.write(`${JSON.stringify(await runPage(browser, plan.origin, spec))}\n`);
    }
    process.stdout.write(`${JSON.stringify({ chromium: browser.version() })}\n`);
  } finally {
    await browser.close();
  }
}

main().catch((error) => {
  process.stderr.write(`drive.mjs: error: ${error.stack ?? error}\n`);
  process.exit(1);
});
