// The page and the library in headless Chromium against Python: WEB_TEST_EXPORTS is a folder
// written by tools/make_test_exports.py (two exports and reference.json: Python LiteRT's
// logits and `keras-attn predict`'s results on each golden text of each file).
import { readFileSync } from "node:fs";

import { expect, test, type Page } from "@playwright/test";

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
const SCREENSHOTS = process.env.WEB_SCREENSHOTS;
// fp32: logits within the float32 path tolerance, the same answers. int8 files keep attention,
// GELU and LayerNorm in float; those run on WebAssembly SIMD kernels here and on AVX-512 / AVX2 /
// NEON ones natively, so a value at a rounding boundary of a later requantization can land one
// int8 step away and carry on through the layers. What must hold: most texts bit-identical
// (measured: 94-100 %), every logit on the same int8 grid (a whole number of the logits' int8
// steps apart), and an answer differs only where Python's own top-two margin is within that
// difference (a near-tie). Dynamic int8 quantizes at run time: its agreement is reported.
const INT8 = new Set(["model_int8.tflite", "model_int8_buckets.tflite"]);
const MIN_BIT_IDENTICAL = 0.8;

/** Console errors, uncaught exceptions and requests that leave the page's origin. */
function watch(page: Page) {
  const seen = { errors: [] as string[], outside: [] as string[] };
  page.on("console", (m) => { if (m.type() === "error") seen.errors.push(m.text()); });
  page.on("pageerror", (e) => seen.errors.push(`uncaught: ${e.message}`));
  const origin = new URL(test.info().project.use.baseURL!).origin;
  page.on("request", (r) => {
    const url = new URL(r.url());
    if (!["data:", "blob:"].includes(url.protocol) && url.origin !== origin) seen.outside.push(r.url());
  });
  return seen;
}

/** The library module of dist/, in the page: each text's logits and result. */
async function runInPage(page: Page, url: string, texts: string[]) {
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

function maxDifference(a: number[][], b: number[][]): number {
  if (a.length !== b.length || a.some((row, i) => row.length !== b[i].length)) return Infinity;
  return Math.max(0, ...a.flatMap((row, i) => row.map((v, j) => Math.abs(v - b[i][j]))));
}

/** How far any difference is from a whole number of int8 steps (0 on the same grid). */
function offGrid(a: number[][], b: number[][], step: number): number {
  return Math.max(0, ...a.flatMap((row, i) => row.map((v, j) => {
    const steps = Math.abs(v - b[i][j]) / step;
    return Math.abs(steps - Math.round(steps)) / Math.max(1, steps);
  })));
}

/** The smallest top-two margin over Python's rows: how close its answer was to a tie. */
function smallestMargin(logits: number[][]): number {
  return Math.min(...logits.map((row) => {
    const [first, second] = [...row].sort((x, y) => y - x);
    return first - second;
  }));
}

const rows = (logits: number[] | number[][]) => (Array.isArray(logits[0]) ? logits as number[][] : [logits as number[]]);
/** The answer of a result: the label, or the entities, words and word tags. */
const answer = (result: Record<string, unknown>) => JSON.stringify(result.label ?? [result.entities, result.words, result.num_truncated_words]);

for (const [index, exported] of REFERENCE.exports.entries()) {
  for (const [file, records] of Object.entries(exported.files)) {
    test(`${exported.task} ${file}: logits and answers as Python's on ${records.length} golden texts`, async ({ page }) => {
      const seen = watch(page);
      await page.goto("./?preload=0");
      const texts = records.map((r) => r.text);
      const got = await runInPage(page, `models/${index}/${file}`, texts);
      let worst = 0;
      let agree = 0;
      let identical = 0;
      records.forEach((record, i) => {
        const expected = rows(record.logits);
        const difference = maxDifference(got[i].logits, expected);
        const same = answer(got[i].result) === answer(record.result);
        worst = Math.max(worst, difference);
        agree += Number(same);
        identical += Number(difference === 0);
        const where = `${file} "${record.text}"`;
        if (file === "model_fp32.tflite") {
          expect(difference, where).toBeLessThanOrEqual(exported.fp32_atol);
          expect(answer(got[i].result), where).toBe(answer(record.result));
        } else if (INT8.has(file)) {
          expect(offGrid(got[i].logits, expected, exported.output_steps[file]!), where).toBeLessThan(1e-3);
          if (!same) expect(smallestMargin(expected), `${where}: an answer changed away from a near-tie`).toBeLessThanOrEqual(2 * difference);
        }
      });
      console.log(`${exported.task} ${file}: max |Δlogit| ${worst.toExponential(2)}, same answer on ${agree}/${records.length}, bit-identical on ${identical}`);
      if (INT8.has(file)) expect(identical, "bit-identical texts").toBeGreaterThanOrEqual(MIN_BIT_IDENTICAL * records.length);
      expect(seen.errors).toEqual([]);
      expect(seen.outside).toEqual([]);
    });
  }
}

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
