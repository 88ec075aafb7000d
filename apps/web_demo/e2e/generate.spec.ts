// The Generate tab in headless Chromium against Python LiteRT, on the toy language model
// export of tools/make_test_exports.py (WEB_TEST_EXPORTS; playwright.config.ts serves it
// beside the others): `reference.json`'s `generation` holds, per file, Python's greedy ids,
// texts and streamed pieces (tools/generation_reference.py: `file_generator(...).generate`)
// of a dozen prompts. Each prompt is typed into the page and run as a person runs it (the Run
// button), greedy, with every position the prompt leaves.
import { readFileSync } from "node:fs";

import { expect, test, type Page } from "@playwright/test";

import RULES from "./parity_rules.json" with { type: "json" };
import { translationParity } from "./translationParity";
import { watch } from "./watch";

interface GenerationRecord {
  prompt: string;
  prompt_ids: number[];
  /** Python's new ids: every position the prompt leaves (the toy has no stop token). */
  greedy: number[];
  text: string;
  /** What `generate(..., on_text=...)` streamed, piece by piece. */
  pieces: string[];
}
interface GenerationReference {
  export: string;
  files: Record<string, { max_length: number; records: GenerationRecord[] }>;
}

const EXPORTS = process.env.WEB_TEST_EXPORTS;
if (!EXPORTS) throw new Error("WEB_TEST_EXPORTS is not set: run tools/make_test_exports.py OUT and set it to OUT (make test-web does both)");
const REFERENCE: GenerationReference | undefined = JSON.parse(readFileSync(`${EXPORTS}/reference.json`, "utf-8")).generation;
if (!REFERENCE) throw new Error(`${EXPORTS}/reference.json has no "generation": re-run tools/make_test_exports.py ${EXPORTS}`);
const FP32 = "generation_fp32.tflite";
const INT8 = "generation_int8.tflite";
/** The export's name in the page's Model menu (tools/serve.mjs: the folder above `export`). */
const EXPORT_NAME = REFERENCE.export.replace(/\/export\/?$/, "").replace(/^.*\//, "");

/** What the page showed for one prompt: the continuation and each state before it. */
interface Shown {
  tokens: number[];
  text: string;
  /** Each state the line showed while decoding, in order: the ids and the text shown. */
  partials: { tokens: number[]; text: string }[];
  latency: string;
}

/** Picks `name` of the language model export in the page's Model menu and waits for its card. */
async function chooseFile(page: Page, name: string): Promise<void> {
  const value = await page.locator("#model-select option", { hasText: `${EXPORT_NAME} / ${name}` }).getAttribute("value");
  await page.selectOption("#model-select", value!);
  await expect(page.locator("#card-fields [data-field=file]")).toHaveText(`${EXPORT_NAME}/${name}`, { timeout: 60_000 });
}

/**
 * Types `prompt` and presses Run; what the line showed. A mutation observer records the
 * continuation's text and the line's `data-tokens` at every change (the page sets the text,
 * then the ids, at each step), so each state is exact whatever the browser painted.
 */
async function generateInPage(page: Page, prompt: string): Promise<Shown> {
  await page.fill("#text", prompt);
  await page.evaluate(() => {
    const w = window as unknown as { states: { tokens: string; text: string }[]; observer?: MutationObserver };
    w.observer?.disconnect();
    w.states = [];
    // Loading the file ran the tab's default prompt: on a slow machine that generation may
    // still be decoding. Its line leaves the page (it stops at its next token, once Run starts
    // a newer one), so only this prompt's line is recorded.
    document.getElementById("result")!.replaceChildren();
    w.observer = new MutationObserver(() => {
      const line = document.getElementById("generation");
      if (!line || line.dataset.state !== "decoding" || line.dataset.tokens === undefined) return;
      const state = { tokens: line.dataset.tokens, text: document.getElementById("continuation")!.textContent ?? "" };
      const last = w.states[w.states.length - 1];
      if (!last || last.tokens !== state.tokens || last.text !== state.text) w.states.push(state);
    });
    w.observer.observe(document.getElementById("result")!, { subtree: true, attributes: true, attributeFilter: ["data-tokens"] });
  });
  await page.click("#run");
  await expect(page.locator('#generation[data-state="done"]')).toHaveCount(1, { timeout: 60_000 });
  return page.evaluate(() => {
    const w = window as unknown as { states: { tokens: string; text: string }[]; observer: MutationObserver };
    w.observer.disconnect();
    const line = document.getElementById("generation")!;
    const ids = (value: string | undefined) => (value ? value.split(" ").map(Number) : []);
    return { tokens: ids(line.dataset.tokens), text: document.getElementById("continuation")!.textContent ?? "",
      partials: w.states.filter((s) => s.tokens !== "").map((s) => ({ tokens: ids(s.tokens), text: s.text })),
      latency: document.getElementById("latency")!.textContent ?? "" };
  });
}

/** The page, on the Generate tab with `file` of the toy export loaded (no other model). */
async function openGenerateTab(page: Page, file: string): Promise<void> {
  await page.goto("./?preload=0");
  await expect(page.locator("#tab-generation")).toBeVisible();
  await page.click("#tab-generation");
  await chooseFile(page, file);
}

test(`Generate tab, ${FP32}: Python LiteRT's greedy ids and text, streamed character by character`, async ({ page }) => {
  const { max_length, records } = REFERENCE.files[FP32]!;
  expect(records.length).toBeGreaterThanOrEqual(8);
  const seen = watch(page);
  await openGenerateTab(page, FP32);
  await expect(page.locator("#text-label")).toHaveText("Prompt");
  for (const record of records) {
    const shown = await generateInPage(page, record.prompt);
    const what = `"${record.prompt}"`;
    expect(record.prompt_ids.length + record.greedy.length, "Python used every position").toBe(max_length);
    expect(shown.tokens, what).toEqual(record.greedy);
    expect(shown.text, what).toBe(record.text);
    // Step k shows Python's first k ids and the text of its first k pieces (one character a step).
    expect(record.pieces.length, `${what}: Python streamed one piece per token`).toBe(record.greedy.length);
    expect(shown.partials, `${what}: the text shown step by step`).toEqual(record.greedy.map((_, k) => ({
      tokens: record.greedy.slice(0, k + 1), text: record.pieces.slice(0, k + 1).join("") })));
    expect(shown.latency, what).toMatch(new RegExp(`^[\\d.]+ ms per token: ${record.greedy.length} new tokens`));
  }
  console.log(`${FP32}: Python's greedy ids and text on all ${records.length} prompts, shown token by token`);
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);
});

test(`Generate tab, ${INT8}: the int8 generation rules (e2e/parity_rules.json) against Python LiteRT`, async ({ page }) => {
  const { records } = REFERENCE.files[INT8]!;
  const seen = watch(page);
  await openGenerateTab(page, INT8);
  const shown: number[][] = [];
  for (const record of records) shown.push((await generateInPage(page, record.prompt)).tokens);
  const prompts = records.map((r) => r.prompt);
  const python = records.map((r) => r.greedy);
  const report = translationParity(prompts, python, shown, RULES.generation);
  console.log(`${INT8}: Python's ids on ${report.sameIds}/${report.sentences} prompts, the same token at ${report.agreed}/${report.positions} positions` +
    `${report.parted.length ? `; parted: ${report.parted.map((p) => `"${p.text}" ${p.python.join(" ")} -> ${p.page.join(" ")}`).join("; ")}` : ""}`);
  expect(report.failures, `${INT8}: the generation rules`).toEqual([]);
  // The rules can fail: the page's ids with three prompts parted from their 2nd token break them.
  const changed = shown.map((ids, i) => (i < 3 ? ids.map((id, j) => (j >= 1 ? id + 1 : id)) : ids));
  expect(translationParity(prompts, python, changed, RULES.generation).failures.length, "three prompts parted must break the rules").toBeGreaterThan(0);
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);
});

test("the Generate tab: shown for a served language model export, the card's file, sampling, errors, a dropped file", async ({ page }) => {
  const seen = watch(page);
  const exportCard = JSON.parse(readFileSync(`${REFERENCE.export}/model_card.json`, "utf-8"));
  const { max_length, records } = REFERENCE.files[FP32]!;
  await page.setViewportSize({ width: 412, height: 915 }); // a phone
  await page.goto("./");
  await expect(page.locator("#tab-generation")).toBeVisible();
  await expect(page.locator("#run")).toBeEnabled({ timeout: 60_000 }); // every model loaded
  await page.click("#tab-generation");
  // The export's own choice of file (its card's default_file).
  await expect(page.locator("#card-fields [data-field=file]")).toHaveText(`${EXPORT_NAME}/${exportCard.default_file}`);
  await expect(page.locator("#card-fields [data-field=task]")).toHaveText(/text generation/);
  await expect(page.locator("#card-fields [data-field=positions]")).toContainText(`${max_length} tokens`);
  await expect(page.locator("#generate-options")).toBeVisible();
  await expect(page.locator("#sampling-options")).toBeHidden();
  await expect(page.locator('#generation[data-state="done"]')).toHaveCount(1, { timeout: 60_000 }); // the example
  await expect(page.locator("#latency")).toContainText("ms per token");
  await chooseFile(page, FP32);

  // New tokens: a prefix of the greedy continuation.
  const record = records[0]!;
  await page.fill("#max-new-tokens", "5");
  const five = await generateInPage(page, record.prompt);
  expect(five.tokens).toEqual(record.greedy.slice(0, 5));
  await expect(page.locator("#decoding")).toHaveText("greedy decoding, 5 new tokens");

  // Top-k sampling with a seed: the same text twice, another seed another text (among a few).
  await page.fill("#max-new-tokens", "");
  await page.selectOption("#sampler", "sample");
  await expect(page.locator("#sampling-options")).toBeVisible();
  await page.fill("#top-k", "3");
  const sampled = new Set<string>();
  for (const seed of ["1", "2", "3"]) {
    await page.fill("#seed", seed);
    const a = await generateInPage(page, record.prompt);
    const b = await generateInPage(page, record.prompt);
    expect(b.tokens, `seed ${seed} repeats`).toEqual(a.tokens);
    expect(a.tokens.length).toBe(record.greedy.length);
    sampled.add(a.text);
    await expect(page.locator("#decoding")).toHaveText(`sampling, top-3, seed ${seed}, ${a.tokens.length} new tokens`);
  }
  expect(sampled.size, "three seeds give more than one text").toBeGreaterThan(1);
  await page.selectOption("#sampler", "greedy");

  // What cannot be generated: the library's messages, in the page.
  await page.fill("#text", "   ");
  await page.click("#run");
  await expect(page.locator("#notice")).toHaveText("Type a prompt for the model to continue.");
  const tooLong = "to be ".repeat(Math.ceil(max_length / 6)).slice(0, max_length);
  await page.fill("#text", tooLong);
  await page.click("#run");
  await expect(page.locator("#message")).toHaveText(
    `the prompt is ${max_length} tokens, the model has ${max_length} positions: shorten the prompt (its last words carry most of what comes next)`);
  await page.fill("#max-new-tokens", String(max_length));
  await page.fill("#text", "to be");
  await page.click("#run");
  await expect(page.locator("#message")).toHaveText(
    `${max_length} new tokens after a prompt of 5 do not fit the model's ${max_length} positions: ask for at most ${max_length - 5}`);
  await page.fill("#max-new-tokens", "");

  // A language model file dropped on another tab becomes the Generate tab's model.
  await page.click("#tab-classification");
  await expect(page.locator("#generate-options")).toBeHidden();
  await page.setInputFiles("#file-input", { name: INT8, mimeType: "application/octet-stream", buffer: readFileSync(`${REFERENCE.export}/${INT8}`) });
  await expect(page.locator("#message")).toContainText("is a language model, not a classification one");
  await expect(page.locator("#tab-generation")).toHaveAttribute("aria-selected", "true");
  await expect(page.locator("#card-fields [data-field=file]")).toHaveText(INT8);
  const int8 = REFERENCE.files[INT8]!.records;
  const shown = await generateInPage(page, int8[1]!.prompt);
  expect(shown.text.length).toBe(int8[1]!.greedy.length);
  // Run pressed twice at once: the first generation stops at its first token, the second ends.
  await page.fill("#text", int8[2]!.prompt);
  await page.evaluate(() => { const run = document.getElementById("run")!; run.click(); run.click(); });
  await expect(page.locator('#generation[data-state="done"]')).toHaveCount(1, { timeout: 60_000 });
  await expect(page.locator("#generation")).toHaveAttribute("data-tokens", /\d( \d+)+/);
  await expect(page.locator("#message")).toHaveText(/is a language model/); // no error replaced it
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);

  // Without a language model export the tab is not there.
  await page.route("**/models/index.json", async (route) => {
    const index = await (await route.fetch()).json();
    await route.fulfill({ json: { exports: index.exports.filter((e: { task: string }) => e.task !== "causal_lm") } });
  });
  await page.goto("./?preload=0");
  await expect(page.locator("#model-select option")).not.toHaveCount(1);
  await expect(page.locator("#tab-generation")).toBeHidden();
});
