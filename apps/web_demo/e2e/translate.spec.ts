// The Translate tab in headless Chromium against Python LiteRT, on the toy translation export
// of tools/make_test_exports.py (WEB_TEST_EXPORTS; make test-web serves it beside the other
// two): `reference.json`'s `translation` holds, per file, Python's greedy and beam search ids
// and texts (tools/translation_reference.py) of the dev sources and of a few sources off the
// toy's distribution, where beam search and greedy decoding part. Each source is typed into
// the page and run as a person runs it (the Run button), for each decoding.
import { readFileSync } from "node:fs";

import { expect, test, type Page } from "@playwright/test";

import { translationParity } from "./translationParity";
import { watch } from "./watch";

interface TranslationRecord {
  text: string;
  source_ids: number[];
  /** Python's ids, `target_max_length` long (padding after EOS). */
  greedy: number[];
  beam: number[];
  greedy_translation: string;
  /** The beam search translation (`Translator.translate`, the card's beams). */
  translation: string;
}
interface TranslationReference {
  export: string;
  files: Record<string, { card: { num_beams: number; eos_token_id: number; target_max_length: number }; records: TranslationRecord[] }>;
}

const EXPORTS = process.env.WEB_TEST_EXPORTS;
if (!EXPORTS) throw new Error("WEB_TEST_EXPORTS is not set: run tools/make_test_exports.py OUT and set it to OUT (make test-web does both)");
const REFERENCE: TranslationReference | undefined = JSON.parse(readFileSync(`${EXPORTS}/reference.json`, "utf-8")).translation;
if (!REFERENCE) throw new Error(`${EXPORTS}/reference.json has no "translation": re-run tools/make_test_exports.py ${EXPORTS}`);
const FP32 = "translation_fp32.tflite";
const INT8 = "translation_int8.tflite";
/** The export's name in the page's menu (tools/serve.mjs: the folder above `export`). */
const EXPORT_NAME = REFERENCE.export.replace(/\/export\/?$/, "").replace(/^.*\//, "");

/** What the page showed for one source: the translation, and each partial before it. */
interface Shown {
  tokens: number[];
  text: string;
  /** The token ids of each state the line showed while decoding, in order. */
  partials: number[][];
  latency: string;
}

/** Python's ids up to EOS (excluded). */
function untilEos(ids: number[], eos: number): number[] {
  return ids.includes(eos) ? ids.slice(0, ids.indexOf(eos)) : ids;
}

/** Picks `name` of the translation export in the page's Model menu and waits for its card. */
async function chooseFile(page: Page, name: string): Promise<void> {
  const value = await page.locator("#model-select option", { hasText: `${EXPORT_NAME} / ${name}` }).getAttribute("value");
  await page.selectOption("#model-select", value!);
  await expect(page.locator("#card-fields [data-field=file]")).toHaveText(`${EXPORT_NAME}/${name}`, { timeout: 60_000 });
}

/**
 * Types `text`, sets the beams and presses Run; what the translation line showed. A mutation
 * observer keeps every value the line's `data-tokens` took (each record's old value is the
 * value set before it), so the partials are exact whatever the browser painted.
 */
async function translateInPage(page: Page, text: string, beams: number): Promise<Shown> {
  await page.fill("#beams", String(beams));
  await page.fill("#text", text);
  await page.evaluate(() => {
    const w = window as unknown as { records: MutationRecord[]; observer?: MutationObserver };
    w.observer?.disconnect();
    w.records = [];
    w.observer = new MutationObserver((records) => w.records.push(...records));
    w.observer.observe(document.getElementById("result")!, { subtree: true, attributes: true, attributeFilter: ["data-tokens"], attributeOldValue: true });
  });
  await page.click("#run");
  await expect(page.locator('#translation[data-state="done"]')).toHaveCount(1, { timeout: 60_000 });
  return page.evaluate(() => {
    const w = window as unknown as { records: MutationRecord[]; observer: MutationObserver };
    w.records.push(...w.observer.takeRecords());
    const line = document.getElementById("translation")!;
    const ids = (value: string | null | undefined) => (value ? value.split(" ").map(Number) : []);
    // The line starts empty; each record's old value is the previous state.
    const values = [...w.records.filter((r) => r.target === line).slice(1).map((r) => r.oldValue), line.dataset.tokens];
    return { tokens: ids(line.dataset.tokens), text: line.textContent ?? "", partials: values.slice(0, -1).map(ids),
      latency: document.getElementById("latency")!.textContent ?? "" };
  });
}

/** The page, on the Translate tab with `file` of the toy export loaded (no other model). */
async function openTranslateTab(page: Page, file: string): Promise<void> {
  await page.goto("./?preload=0");
  await expect(page.locator("#tab-translation")).toBeVisible();
  await page.click("#tab-translation");
  await chooseFile(page, file);
}

test(`Translate tab, ${FP32}: Python LiteRT's ids and texts, greedy and beam search, tokens shown as decoded`, async ({ page }) => {
  const { card, records } = REFERENCE.files[FP32]!;
  const eos = card.eos_token_id;
  expect(records.length).toBeGreaterThanOrEqual(4);
  const seen = watch(page);
  await openTranslateTab(page, FP32);
  await expect(page.locator("#beams")).toHaveValue(String(card.num_beams)); // the card's
  let parted = 0;
  for (const record of records) {
    const greedy = await translateInPage(page, record.text, 1);
    expect(greedy.tokens, `greedy "${record.text}"`).toEqual(untilEos(record.greedy, eos));
    expect(greedy.text, `greedy "${record.text}"`).toBe(record.greedy_translation);
    // Greedy decoding shows each token as it comes: step k shows Python's first k ids.
    const steps = Math.min(record.greedy.indexOf(eos) + 1 || card.target_max_length, card.target_max_length);
    expect(greedy.partials, `greedy "${record.text}": the tokens shown step by step`)
      .toEqual(Array.from({ length: steps }, (_, k) => record.greedy.slice(0, k + 1)));
    expect(greedy.latency).toMatch(/^[\d.]+ ms per sentence/);

    const beam = await translateInPage(page, record.text, card.num_beams);
    expect(beam.tokens, `${card.num_beams} beams "${record.text}"`).toEqual(untilEos(record.beam, eos));
    expect(beam.text, `${card.num_beams} beams "${record.text}"`).toBe(record.translation);
    expect(beam.partials.length, "beam search shows the best live beam while it decodes").toBeGreaterThan(0);
    if (record.beam.join() !== record.greedy.join()) parted += 1;
  }
  console.log(`${FP32}: Python's ids on all ${records.length} sources, greedy and ${card.num_beams} beams (beam search parts from greedy on ${parted})`);
  expect(parted, "the sources reach where beam search and greedy decoding part").toBeGreaterThan(0);
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);
});

test(`Translate tab, ${INT8}: the int8 translation rules (e2e/parity_rules.json) against Python LiteRT`, async ({ page }) => {
  const { card, records } = REFERENCE.files[INT8]!;
  const eos = card.eos_token_id;
  const seen = watch(page);
  await openTranslateTab(page, INT8);
  const texts = records.map((r) => r.text);
  for (const [beams, key] of [[1, "greedy"], [card.num_beams, "beam"]] as const) {
    const shown: number[][] = [];
    for (const record of records) shown.push((await translateInPage(page, record.text, beams)).tokens);
    const python = records.map((r) => untilEos(r[key], eos));
    const report = translationParity(texts, python, shown);
    console.log(`${INT8} ${key}: Python's ids on ${report.sameIds}/${report.sentences} sources, the same token at ${report.agreed}/${report.positions} positions` +
      `${report.parted.length ? `; parted: ${report.parted.map((p) => `"${p.text}" ${p.python.join(" ")} -> ${p.page.join(" ")}`).join("; ")}` : ""}`);
    expect(report.failures, `${INT8} ${key}: the translation rules (e2e/translationParity.ts)`).toEqual([]);
    // The rules can fail: the same page ids with the last token of two sources changed break them.
    const changed = shown.map((ids, i) => (i < 2 && ids.length ? [...ids.slice(0, -1), ids[ids.length - 1]! + 1] : ids));
    expect(translationParity(texts, python, changed).failures.length, "two sources parted must break the rules").toBeGreaterThan(0);
  }
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);
});

test("the Translate tab: shown for a served translation export, the card's file and beams, a dropped file, nothing fetched from outside", async ({ page }) => {
  const seen = watch(page);
  const exportCard = JSON.parse(readFileSync(`${REFERENCE.export}/model_card.json`, "utf-8"));
  const { card, records } = REFERENCE.files[FP32]!;
  await page.setViewportSize({ width: 412, height: 915 }); // a phone
  await page.goto("./");
  await expect(page.locator("#tab-translation")).toBeVisible();
  await expect(page.locator("#run")).toBeEnabled({ timeout: 60_000 }); // every model loaded
  await page.click("#tab-translation");
  // The export's own choice of file (its card's default_file) and the card's beams.
  await expect(page.locator("#card-fields [data-field=file]")).toHaveText(`${EXPORT_NAME}/${exportCard.default_file}`);
  await expect(page.locator("#card-fields [data-field=task]")).toHaveText(/translation/);
  await expect(page.locator("#beams")).toHaveValue(String(exportCard.num_beams));
  await expect(page.locator("#text-label")).toHaveText("Source sentence");
  await expect(page.locator('#translation[data-state="done"]')).toHaveCount(1, { timeout: 60_000 }); // the example
  if (exportCard.default_file === FP32) {
    const record = records[0]!;
    const shown = await translateInPage(page, record.text, card.num_beams);
    expect(shown.text).toBe(record.translation);
    await expect(page.locator("#decoding")).toContainText(`beam search, ${card.num_beams} beams`);
  }
  await expect(page.locator("#latency")).toContainText("ms per sentence");
  await page.fill("#text", "   ");
  await page.click("#run");
  await expect(page.locator("#notice")).toHaveText("Type a sentence to translate it.");

  // A translation file dropped on another tab becomes the Translate tab's model.
  await page.click("#tab-classification");
  await expect(page.locator("#translate-options")).toBeHidden();
  await page.setInputFiles("#file-input", { name: INT8, mimeType: "application/octet-stream", buffer: readFileSync(`${REFERENCE.export}/${INT8}`) });
  await expect(page.locator("#message")).toContainText("is a translation model, not a classification one");
  await expect(page.locator("#tab-translation")).toHaveAttribute("aria-selected", "true");
  await expect(page.locator("#card-fields [data-field=file]")).toHaveText(INT8);
  const shown = await translateInPage(page, records[0]!.text, 1);
  expect(shown.text).toBe(REFERENCE.files[INT8]!.records[0]!.greedy_translation);
  // Run pressed twice at once: the first translation stops at its first token, the second ends.
  await page.fill("#text", records[1]!.text);
  await page.evaluate(() => { const run = document.getElementById("run")!; run.click(); run.click(); });
  await expect(page.locator('#translation[data-state="done"]')).toHaveText(REFERENCE.files[INT8]!.records[1]!.greedy_translation);
  await expect(page.locator("#message")).toHaveText(/is a translation model/); // no error replaced it
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);

  // Without a translation export the tab is not there.
  await page.route("**/models/index.json", async (route) => {
    const index = await (await route.fetch()).json();
    await route.fulfill({ json: { exports: index.exports.filter((e: { task: string }) => e.task !== "seq2seq") } });
  });
  await page.goto("./?preload=0");
  await expect(page.locator("#model-select option")).not.toHaveCount(1);
  await expect(page.locator("#tab-translation")).toBeHidden();
});
