// The page and the library in headless Chromium against Python: WEB_TEST_EXPORTS is a folder
// written by tools/make_test_exports.py (two exports and reference.json: Python LiteRT's
// logits and `keras-attn predict`'s results on each golden text of each file).
import { readFileSync, writeFileSync } from "node:fs";

import { expect, test, type Page } from "@playwright/test";

import { answerOf, int8Parity, rowsOf, type Outputs } from "./parity";
import { nudgeInt8Weight } from "./tfliteWeights";
import { watch } from "./watch";

interface PythonRecord {
  text: string;
  logits: number[] | number[][];
  result: Record<string, unknown>;
}
interface PythonExport {
  dir: string;
  task: string;
  fp32_atol: number;
  output_steps: Record<string, number | null>;
  files: Record<string, PythonRecord[]>;
}

const EXPORTS = process.env.WEB_TEST_EXPORTS;
if (!EXPORTS) throw new Error("WEB_TEST_EXPORTS is not set: run tools/make_test_exports.py OUT and set it to OUT (make test-web does both)");
const REFERENCE: { exports: PythonExport[] } = JSON.parse(readFileSync(`${EXPORTS}/reference.json`, "utf-8"));
// fp32: logits within the float32 path tolerance, the same answers. int8 files: the rules of
// e2e/parity.ts (numbers in e2e/parity_rules.json, fixed before the page runs): bit-identical
// logits on most texts, no logit more than a few int8 steps away, and an answer changed only on
// a row (a token, for a tagger) where Python's own top-two margin is a near-tie. Dynamic int8
// quantizes at run time: its agreement is reported.
const INT8 = new Set(["model_int8.tflite", "model_int8_buckets.tflite"]);
const SCREENSHOTS = process.env.WEB_SCREENSHOTS;
// WEB_PARITY_RECORD=FILE.json writes the Python and page outputs of model_int8.tflite (and of
// its nudged copy) that test/parity.test.ts replays: per export, every text whose page logits
// differ from Python's, then the first others, RECORD_TEXTS in all, in their order; logits as
// the shortest decimals that read back (Math.fround) to the same float32.
const RECORD = process.env.WEB_PARITY_RECORD;
const RECORD_TEXTS = 40;
/** How far the nudged copy moves one weight of the head (int8 steps, tfliteWeights.ts). */
const NUDGE = 16;

/** The library module of dist/, in the page: each text's logits and result. */
async function runInPage(page: Page, url: string, texts: string[]): Promise<Outputs[]> {
  return page.evaluate(async ({ url, texts }) => {
    const lib = await import(new URL("keras-attn-web.js", document.baseURI).href);
    const model = await lib.loadModel(url, { wasmPath: new URL("litert-wasm/", document.baseURI).href });
    const out = [];
    for (const text of texts) {
      const run = await model.run(text);
      out.push({ logits: run.logits.map((row: Float32Array) => Array.from(row)), result: run.result });
    }
    model.delete();
    return out;
  }, { url, texts });
}

function maxDifference(a: Outputs["logits"], b: Outputs["logits"]): number {
  const [x, y] = [rowsOf(a), rowsOf(b)];
  if (x.length !== y.length || x.some((row, i) => row.length !== y[i].length)) return Infinity;
  return Math.max(0, ...x.flatMap((row, i) => row.map((v, j) => Math.abs(v - y[i][j]))));
}

const recorded: Record<string, {
  step: number | null;
  kept: number[];
  records: PythonRecord[];
  page: Outputs[];
  nudged?: { tensor: string; before: number; after: number; page: Outputs[] };
}> = {};

for (const [index, exported] of REFERENCE.exports.entries()) {
  for (const [file, records] of Object.entries(exported.files)) {
    test(`${exported.task} ${file}: logits and answers as Python's on ${records.length} golden texts`, async ({ page }) => {
      const seen = watch(page);
      await page.goto("./?preload=0");
      const texts = records.map((r) => r.text);
      const got = await runInPage(page, `models/${index}/${file}`, texts);
      const differences = records.map((record, i) => maxDifference(got[i].logits, record.logits));
      const agree = records.filter((record, i) => answerOf(got[i].result) === answerOf(record.result)).length;
      const identical = differences.filter((d) => d === 0).length;
      console.log(`${exported.task} ${file}: max |Δlogit| ${Math.max(...differences).toExponential(2)}, same answer on ${agree}/${records.length}, bit-identical on ${identical}`);
      if (file === "model_fp32.tflite") {
        records.forEach((record, i) => {
          expect(differences[i], `${file} "${record.text}"`).toBeLessThanOrEqual(exported.fp32_atol);
          expect(answerOf(got[i].result), `${file} "${record.text}"`).toBe(answerOf(record.result));
        });
      } else if (INT8.has(file)) {
        const report = int8Parity(texts, records, got, exported.output_steps[file]!);
        console.log(`${exported.task} ${file}: largest move ${report.maxSteps.toFixed(0)} int8 steps, rows flipped: ${report.perText.flatMap((t) => t.flips.map((f) => f.margin.toFixed(1))).join(", ") || "none"} (Python's margins in steps)`);
        expect(report.failures, `${file}: the int8 parity rules (e2e/parity.ts)`).toEqual([]);
        if (file === "model_int8.tflite") recorded[exported.task] = { step: exported.output_steps[file], kept: recordedTexts(differences), records, page: got };
      }
      expect(seen.errors).toEqual([]);
      expect(seen.outside).toEqual([]);
    });
  }

  test(`${exported.task} model_int8.tflite with one weight nudged ${NUDGE} steps: the int8 parity rules fail`, async ({ page }) => {
    const records = exported.files["model_int8.tflite"];
    const nudged = nudgeInt8Weight(readFileSync(`${exported.dir}/model_int8.tflite`), NUDGE);
    await page.route("**/nudged/model_int8.tflite", (route) => route.fulfill({ body: Buffer.from(nudged.bytes), contentType: "application/octet-stream" }));
    await page.goto("./?preload=0");
    const texts = records.map((r) => r.text);
    const got = await runInPage(page, "nudged/model_int8.tflite", texts);
    const report = int8Parity(texts, records, got, exported.output_steps["model_int8.tflite"]!);
    console.log(`${exported.task} nudged ${nudged.tensor}[0] ${nudged.before} -> ${nudged.after}: bit-identical on ${report.identical}/${report.texts}, largest move ${report.maxSteps.toFixed(0)} steps, ${report.failures.length} failures, e.g. ${report.failures[0]}`);
    expect(report.failures.length, "the rules must catch a nudged weight").toBeGreaterThan(0);
    const entry = recorded[exported.task];
    if (entry) entry.nudged = { tensor: nudged.tensor, before: nudged.before, after: nudged.after, page: got };
  });
}

/** The indices recorded: the texts whose logits differ, then the first others, in order. */
function recordedTexts(differences: number[]): number[] {
  const differ = differences.flatMap((d, i) => (d === 0 ? [] : [i]));
  const same = differences.flatMap((d, i) => (d === 0 ? [i] : [])).slice(0, Math.max(0, RECORD_TEXTS - differ.length));
  return [...differ, ...same].sort((a, b) => a - b);
}

test.afterAll(() => {
  if (!RECORD) return;
  const pick = <T>(list: T[], kept: number[]) => kept.map((i) => list[i]);
  const float32 = (key: string, value: unknown) => (key === "logits" ? JSON.parse(JSON.stringify(value), (_, v) => (typeof v === "number" ? Number(Math.fround(v).toPrecision(9)) : v)) : value);
  const document = Object.fromEntries(Object.entries(recorded).map(([task, e]) => [task, {
    step: e.step,
    records: pick(e.records, e.kept),
    page: pick(e.page, e.kept),
    nudged: e.nudged && { ...e.nudged, page: pick(e.nudged.page, e.kept) },
  }]));
  writeFileSync(RECORD, JSON.stringify(document, float32));
});

const int8Buckets = (task: string) => {
  const exported = REFERENCE.exports.find((e) => e.task === task)!;
  return exported.files["model_int8_buckets.tflite"];
};

test("the page: both tabs answer as keras-attn predict, nothing fetched from outside", async ({ page }) => {
  const seen = watch(page);
  await page.setViewportSize({ width: 412, height: 915 }); // a phone
  await page.goto("./");
  await expect(page.locator("#card-fields [data-field=task]")).toHaveText("text classification", { timeout: 60_000 });
  await expect(page.locator("#card-fields [data-field=file]")).toHaveText(/model_int8_buckets\.tflite$/);
  // The page opens on an example sentence of each tab, answered at once (the README's pictures).
  await expect(page.locator(".label")).toBeVisible({ timeout: 60_000 });
  await expect(page.locator("#run")).toBeEnabled({ timeout: 60_000 }); // every model loaded
  if (SCREENSHOTS) await page.screenshot({ path: `${SCREENSHOTS}/web_demo_classify.png`, fullPage: true });
  await page.click("#tab-ner");
  await expect(page.locator("#latency")).toContainText("ms", { timeout: 60_000 });
  if (SCREENSHOTS) await page.screenshot({ path: `${SCREENSHOTS}/web_demo_entities.png`, fullPage: true });
  await page.click("#tab-classification");
  const sentence = int8Buckets("classification").find((r) => r.text.split(" ").length > 4)!;
  await page.fill("#text", sentence.text);
  await page.click("#run");
  await expect(page.locator(".label")).toHaveText(String(sentence.result.label));
  await expect(page.locator("#latency")).toContainText("ms");

  await page.click("#tab-ner");
  await expect(page.locator("#card-fields [data-field=task]")).toHaveText(/named entities/);
  const tagged = int8Buckets("ner").find((r) => (r.result.entities as unknown[]).length > 1);
  if (!tagged) throw new Error("no golden text with two entities: the test tagger learned nothing (tools/make_test_exports.py)");
  await page.fill("#text", tagged.text);
  await page.click("#run");
  const expected = (tagged.result.entities as { type: string; text: string }[]).map((e) => `${e.text}${e.type}`);
  await expect(page.locator("mark")).toHaveText(expected);
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);
});

test("bad input gets a message in the page, never an uncaught exception", async ({ page }) => {
  const seen = watch(page);
  await page.goto("./");
  await expect(page.locator("#card-fields [data-field=task]")).toHaveText("text classification", { timeout: 60_000 });
  const message = page.locator("#message");

  await page.setInputFiles("#file-input", { name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("not a model") });
  await expect(message).toContainText("not a TFLite file");

  const model = readFileSync(`${REFERENCE.exports[0].dir}/model_int8.tflite`);
  await page.setInputFiles("#file-input", { name: "plain.tflite", mimeType: "application/octet-stream", buffer: withoutAssociatedFiles(model) });
  await expect(message).toContainText("embeds no model_card.json");
  await expect(message).toContainText("keras-attn export");

  await page.setInputFiles("#file-input", { name: "tagger.tflite", mimeType: "application/octet-stream", buffer: readFileSync(`${REFERENCE.exports[1].dir}/model_int8_buckets.tflite`) });
  await expect(message).toContainText("named-entity model, not a classification one");
  await expect(page.locator("#tab-ner")).toHaveAttribute("aria-selected", "true");

  await page.click("#tab-classification");
  await page.fill("#text", Array.from({ length: 120 }, (_, i) => `word${i}`).join(" "));
  await page.click("#run");
  await expect(page.locator("#notice")).toContainText("word pieces were cut from its end, as keras-attn predict does");
  await page.click("#tab-ner");

  await page.fill("#text", "   ");
  await page.click("#run");
  await expect(page.locator("#notice")).toHaveText(/Type a text/);

  await page.fill("#text", Array.from({ length: 120 }, (_, i) => `word${i}`).join(" "));
  await page.click("#run");
  await expect(page.locator("#notice")).toContainText("cut and tagged O, as keras-attn predict does");
  expect(seen.errors).toEqual([]);
  expect(seen.outside).toEqual([]);
});

test("threads and WebGPU: the page runs threaded where isolated, and says when WebGPU is missing", async ({ page }) => {
  const seen = watch(page);
  await page.goto("./?threads=2");
  await expect(page.locator("#runtime")).toContainText("2 threads, cross-origin isolated");
  await expect(page.locator("#card-fields [data-field=task]")).toHaveText("text classification", { timeout: 60_000 });
  const sentence = int8Buckets("classification")[5];
  await page.fill("#text", sentence.text);
  await page.click("#run");
  await expect(page.locator(".label")).toHaveText(String(sentence.result.label));
  expect(seen.errors).toEqual([]);

  const hasWebGpu = await page.evaluate(() => "gpu" in navigator);
  await page.goto("./?accelerator=webgpu");
  if (!hasWebGpu) await expect(page.locator("#message")).toContainText('"webgpu" asked for, but this browser has no WebGPU');
});

test("a browser without WebAssembly SIMD is told so", async ({ page }) => {
  const seen = watch(page);
  await page.addInitScript(() => {
    const validate = WebAssembly.validate;
    // SIMD opcodes start with the 0xfd prefix: refuse every module that holds one.
    WebAssembly.validate = (bytes: BufferSource) => !new Uint8Array(bytes as ArrayBuffer).includes(0xfd) && validate(bytes);
  });
  await page.goto("./");
  await expect(page.locator("#message")).toContainText("no WebAssembly SIMD");
  expect(seen.errors).toEqual([]);
});

/** The model flatbuffer alone: the zip of associated files appended to it cut off. */
function withoutAssociatedFiles(file: Buffer): Buffer {
  const end = file.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  const directory = end - file.readUInt32LE(end + 12);
  const shift = directory - file.readUInt32LE(end + 16); // 0 when offsets count from the file's start
  return file.subarray(0, shift + file.readUInt32LE(directory + 42)); // the first entry's local header
}
