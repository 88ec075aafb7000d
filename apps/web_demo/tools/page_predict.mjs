#!/usr/bin/env node
// `keras-attn predict --json`, in a real browser: every text through the built library
// (dist/keras-attn-web.js) on LiteRT.js in headless Chromium, one JSON line per text.
//
//   node tools/page_predict.mjs MODEL.tflite TEXTS.txt [--threads N] [--logits] [--out FILE.jsonl]
//
// TEXTS.txt holds one text per line; each output line is {"line", "text", ...result} as
// `keras-attn predict MODEL.tflite --file TEXTS.txt --json` prints it (empty lines are skipped,
// as there); `--logits` adds each text's "logits" (rows of the real tokens, as `model.run`
// returns them). Needs `npm run build` and Debian's chromium-headless-shell (CHROMIUM overrides
// the binary). The page is served from this process on 127.0.0.1; it fetches nothing else.
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { chromium } from "@playwright/test";

import { handler } from "./serve.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const CHUNK = 200; // texts per page.evaluate call

function parse(argv) {
  const options = { threads: 1, out: null, logits: false, positional: [] };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === "--threads") options.threads = Number(argv[(i += 1)]);
    else if (argv[i] === "--out") options.out = argv[(i += 1)];
    else if (argv[i] === "--logits") options.logits = true;
    else options.positional.push(argv[i]);
  }
  if (options.positional.length !== 2 || !(options.threads >= 1)) {
    throw new Error("usage: node tools/page_predict.mjs MODEL.tflite TEXTS.txt [--threads N] [--logits] [--out FILE.jsonl]");
  }
  return options;
}

/** `[line number, text]` of the non-empty lines, as `keras-attn predict --file` reads them. */
export function readTexts(path) {
  const lines = readFileSync(path, "utf-8").replace(/^\uFEFF/, "").split(/\r?\n/);
  if (lines.at(-1) === "") lines.pop();
  return lines.map((text, i) => [i + 1, text]).filter(([, text]) => text.trim() !== "");
}

async function predictInPage(page, name, texts, threads, logits) {
  await page.evaluate(async ({ name, threads }) => {
    const lib = await import(new URL("keras-attn-web.js", document.baseURI).href);
    globalThis.model = await lib.loadModel(`models/0/${name}`, { threads,
      wasmPath: new URL("litert-wasm/", document.baseURI).href });
  }, { name, threads });
  const results = [];
  for (let start = 0; start < texts.length; start += CHUNK) {
    const chunk = texts.slice(start, start + CHUNK);
    results.push(...await page.evaluate(async ({ chunk, logits }) => {
      const out = [];
      for (const text of chunk) {
        const run = await globalThis.model.run(text);
        out.push(logits ? { ...run.result, logits: run.logits.map((row) => Array.from(row)) } : run.result);
      }
      return out;
    }, { chunk, logits }));
  }
  return results;
}

async function main() {
  const options = parse(process.argv.slice(2));
  const [model, textsPath] = options.positional.map((p) => resolve(p));
  const texts = readTexts(textsPath);
  const server = createServer(handler({ dist: join(HERE, "..", "dist"), exports: [dirname(model)] }));
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium-headless-shell", args: ["--no-sandbox"] });
  try {
    const page = await browser.newPage();
    page.on("pageerror", (error) => { throw error; });
    await page.goto(`http://127.0.0.1:${server.address().port}/?preload=0`);
    const results = await predictInPage(page, basename(model), texts.map(([, t]) => t), options.threads, options.logits);
    const lines = texts.map(([line, text], i) => JSON.stringify({ line, text, ...results[i] }));
    if (options.out) writeFileSync(options.out, lines.join("\n") + "\n");
    else process.stdout.write(lines.join("\n") + "\n");
  } finally {
    await browser.close();
    server.close();
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((error) => {
    console.error(`page_predict.mjs: error: ${error.message}`);
    process.exit(2);
  });
}
