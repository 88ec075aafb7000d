/**
 * The translation path against Python, in Node:
 *
 * - the library (`loadTranslator`, LiteRT.js on the wasm accelerator) on the toy translation
 *   export of tools/make_test_exports.py (`$WEB_TEST_EXPORTS/translation`, default
 *   runs/web_test/translation, the folder `make test-web` writes before running vitest):
 *   the source ids, greedy ids, beam search ids (the card's beams and length penalty) and
 *   texts of Python LiteRT (`TranslationFile`, tools/translation_reference.py) on the dev
 *   sentences and a few harder ones, for the fp32 file;
 * - joined word pieces (encode, and decode of Python's ids) against Python's
 *   `JoinedWordPieces` on every English sentence of Multi30k's test_2016_flickr, over
 *   all-MiniLM-L6-v2's vocabulary plus `[JOIN]` (the toy vocabulary does not cover them).
 *
 * Python runs through `$PYTHON` (default .venv/bin/python), as test/golden.ts.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, test } from "vitest";

import { JoinedWordPieces, TextTables, WordPieceTokenizer } from "../src/lib/core";
import { loadTranslator, type TranslationModel } from "../src/lib/translator";
import { REPO, python } from "./golden";
import { loadLiteRtInNode } from "./litertNode";

const REFERENCE = "apps/web_demo/tools/translation_reference.py";
const EXPORTS = process.env["WEB_TEST_EXPORTS"] ?? join(REPO, "runs/web_test");
const TOY = join(EXPORTS, "translation");
const HAS_TOY = existsSync(join(TOY, "export", "translation_fp32.tflite")) && existsSync(join(TOY, "dev.en"));
const MULTI30K = join(REPO, "../shared/data/multi30k/test_2016_flickr.en");
/**
 * Sources off the toy's distribution, where beam search and greedy decoding part (found by
 * trying random word strings with Python's search; the first runs all 16 steps without
 * EOS), and one cut to max_length.
 */
const HARD = ["five - vier one three six two eins one ! ?", "vier funf vier sechs five drei four two five ?",
  "! funf eins funf", "eins ! five two zwei zwei drei", "sechs eins zwei six drei six zwei drei ! eins vier", "four",
  "one two three four five six one two three four five six one two three four."];

const work = mkdtempSync(join(tmpdir(), "keras-attn-translation-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Runs tools/translation_reference.py; its JSON document. */
function reference(args: string[]): any {
  const out = join(work, `${args[0]}.json`);
  const result = spawnSync(python(), [REFERENCE, args[0]!, out, ...args.slice(1)], {
    cwd: REPO, encoding: "utf-8", env: { ...process.env, TF_CPP_MIN_LOG_LEVEL: "2" } });
  if (result.error !== undefined || result.status !== 0) {
    throw new Error(`cannot run ${python()} ${REFERENCE} ${args.join(" ")} ` +
      `(${result.error?.message ?? (result.stderr ?? "").slice(-2000)}): set PYTHON=the project's Python (make install)`);
  }
  return JSON.parse(readFileSync(out, "utf-8"));
}

describe.skipIf(!HAS_TOY)(
  `translation files against Python LiteRT (skipped when ${TOY} is missing: ` +
    "python apps/web_demo/tools/make_test_exports.py DIR, then WEB_TEST_EXPORTS=DIR)",
  () => {
    let translator: TranslationModel;
    let records: { text: string; source_ids: number[]; greedy: number[]; beam: number[]; translation: string }[];
    let card: { num_beams: number; eos_token_id: number; pad_token_id: number; target_max_length: number };

    beforeAll(async () => {
      const texts = join(work, "texts.txt");
      const dev = readFileSync(join(TOY, "dev.en"), "utf-8").split("\n").filter((line) => line.length > 0);
      writeFileSync(texts, [...dev, ...HARD].join("\n") + "\n");
      const document = reference(["decode", join(TOY, "export"), texts, "--files", "translation_fp32.tflite"]);
      ({ records, card } = document.files["translation_fp32.tflite"]);
      await loadLiteRtInNode();
      translator = await loadTranslator(new Uint8Array(readFileSync(join(TOY, "export", "translation_fp32.tflite"))),
        { name: "translation_fp32.tflite" });
    });
    afterAll(() => translator?.delete());

    /** Python's ids up to EOS (excluded). */
    const untilEos = (ids: number[]) => (ids.includes(card.eos_token_id) ? ids.slice(0, ids.indexOf(card.eos_token_id)) : ids);

    test("the card and the source ids are Python's", () => {
      expect(records.length).toBe(12 + HARD.length);
      expect(translator.card.numBeams).toBe(card.num_beams);
      expect(card.num_beams).toBeGreaterThan(1);
      for (const record of records) {
        const ids = translator.assets.pieces.encode(record.text);
        const source = Array.from(ids.subarray(0, translator.card.maxLength - 1));
        expect([...source, card.eos_token_id], record.text).toEqual(record.source_ids);
      }
      // The longest hard text is cut to max_length (its [SEP] included).
      expect(records[records.length - 1]!.source_ids.length).toBe(translator.card.maxLength);
    });

    test("greedy decoding gives Python's ids and texts, one step call per token", async () => {
      for (const record of records) {
        const partials: string[] = [];
        const out = await translator.translate(record.text, { beams: 1, onToken: (p) => partials.push(p.text) });
        expect(Array.from(out.sourceIds), record.text).toEqual(record.source_ids);
        expect(Array.from(out.tokens), record.text).toEqual(untilEos(record.greedy));
        const generated = Math.min(record.greedy.indexOf(card.eos_token_id) + 1 || card.target_max_length,
          card.target_max_length);
        expect(out.modelCalls).toBe(generated);
        expect(partials.length).toBe(generated);
        expect(partials[partials.length - 1]).toBe(out.text);
      }
    });

    test("beam search with the card's beams gives Python's ids and texts", async () => {
      let differ = 0;
      for (const record of records) {
        const partials: string[] = [];
        const out = await translator.translate(record.text, { onToken: (p) => partials.push(p.text) });
        expect(Array.from(out.tokens), record.text).toEqual(untilEos(record.beam));
        expect(out.text, record.text).toBe(record.translation);
        expect(partials.length).toBeGreaterThan(0);
        if (record.beam.join() !== record.greedy.join()) differ += 1;
      }
      // The check reaches where beam search and greedy decoding part (off the toy's data).
      expect(differ).toBeGreaterThan(0);
    });
  },
);

describe.skipIf(!existsSync(MULTI30K))(
  `joined word pieces against Python on Multi30k (skipped when ${MULTI30K} is missing)`,
  () => {
    test("encode gives Python's ids and decode Python's text on every test_2016_flickr.en sentence", () => {
      const document = reference(["pieces", MULTI30K]);
      const vocabulary: string[] = document.vocabulary;
      const pieces = new JoinedWordPieces(
        new WordPieceTokenizer(vocabulary, document.lowercase, TextTables.load()), vocabulary);
      expect(document.records.length).toBe(1000);
      let joiners = 0;
      for (const record of document.records as { text: string; ids: number[]; decoded: string }[]) {
        expect(Array.from(pieces.encode(record.text)), record.text).toEqual(record.ids);
        expect(pieces.decode(record.ids), record.text).toBe(record.decoded);
        joiners += record.ids.filter((id) => id === pieces.joinerId).length;
      }
      expect(joiners).toBeGreaterThan(500); // the joiner is exercised, not only spaces
    });
  },
);
