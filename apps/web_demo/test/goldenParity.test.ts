/**
 * JavaScript == Python on every golden record the Kotlin core is tested on (the port of its
 * `GoldenParityTest`): for each model directory under the golden root (`test/golden.ts`), the
 * text alone must give the recorded ids, offsets, words, word ids and truncation counts, and
 * the recorded logits must decode to the recorded label and probabilities (within 1e-6, the
 * rounding of the file) or word tags and entity spans. Then `results.ts` against the result
 * dicts of `keras-attn predict --json` (`test/predict_results.py`), and the embedded files of a
 * Python-written `.tflite` against the side files. Prints, per directory, the sentences
 * compared and the mismatches.
 */
import { readFileSync, readdirSync } from "node:fs";
import { basename, join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";

import {
  ModelCard,
  TextTables,
  type WordPieceTokenizer,
  argmax,
  classificationResult,
  decodeNer,
  nerResult,
  prepareNer,
  readModelAssets,
  softmax,
} from "../src/lib/core";
import { type GoldenData, goldenData, modelDirectories } from "./golden";

type GoldenRecord = Record<string, any>;

const tables = TextTables.load();

function lines(path: string): string[] {
  const result = readFileSync(path, "utf-8").split("\n");
  while (result.length > 0 && result[result.length - 1] === "") result.pop();
  return result;
}

function readJsonl(path: string): GoldenRecord[] {
  return lines(path).map((line, i) => {
    try {
      return JSON.parse(line) as GoldenRecord;
    } catch (error) {
      throw new Error(`${path}:${i + 1}: not JSON (${(error as Error).message})`);
    }
  });
}

/** A text as ASCII with `\u{...}` escapes, at most 160 characters. */
function escape(text: string): string {
  let out = "";
  for (const c of text) {
    const code = c.codePointAt(0)!;
    out += code >= 0x20 && code <= 0x7e ? c : `\\u{${code.toString(16).toUpperCase()}}`;
    if (out.length > 160) return `"${out}..."`;
  }
  return `"${out}"`;
}

/** One model directory: its assets and the comparison of every record. */
class Suite {
  readonly name: string;
  readonly card: ModelCard;
  readonly tokenizer: WordPieceTokenizer;
  readonly records: GoldenRecord[];
  readonly mismatches: string[] = [];

  constructor(readonly directory: string) {
    this.name = basename(directory);
    const text = readFileSync(join(directory, "model_card.json"), "utf-8");
    this.card = ModelCard.parse(text, `${this.name}/model_card.json`);
    this.tokenizer = this.card.tokenizer(lines(join(directory, "vocab.txt")), tables, `${this.name}/vocab.txt`);
    this.card.checkLabels(lines(join(directory, "labels.txt")), `${this.name}/labels.txt`);
    this.records = readJsonl(join(directory, "golden_vectors.jsonl"));
  }

  get description(): string {
    const crf = this.card.crf !== null ? ", CRF" : "";
    return `${this.name} (${this.card.task}${crf}, ${this.card.lowercase ? "uncased" : "cased"})`;
  }

  run(): void {
    for (const [i, record] of this.records.entries()) {
      const where = `${this.name}/golden_vectors.jsonl:${i + 1}`;
      const before = this.mismatches.length;
      if (this.card.isTagger) this.compareTagger(record, where);
      else this.compareClassifier(record, where);
      if (this.mismatches.length > before) this.mismatches[before] += `  text=${escape(record["text"])}`;
    }
  }

  private check(where: string, field: string, expected: unknown, actual: unknown): void {
    const [e, a] = [JSON.stringify(expected), JSON.stringify(actual)];
    if (e !== a) this.mismatches.push(`${where} ${field}: python=${e} js=${a}`);
  }

  private compareClassifier(record: GoldenRecord, where: string): void {
    const pieces = this.tokenizer.tokenize(record["text"]);
    const inputs = this.tokenizer.pack(pieces.ids, this.card.sequenceLength);
    this.check(where, "token_ids", record["token_ids"], Array.from(inputs.tokenIds.subarray(0, inputs.length)));
    this.check(where, "piece_starts", record["piece_starts"], Array.from(pieces.starts));
    this.check(where, "piece_ends", record["piece_ends"], Array.from(pieces.ends));
    const logits: number[] = record["logits"];
    this.check(where, "label", record["label"], this.card.labels[argmax(logits)]);
    this.check(where, "result label", record["label"], classificationResult(this.card.labels, logits).label);
    const expected: number[] = record["probabilities"];
    const actual = softmax(logits);
    if (expected.length !== actual.length || expected.some((p, i) => Math.abs(p - actual[i]!) > 1e-6)) {
      this.check(where, "probabilities", expected, actual);
    }
  }

  private compareTagger(record: GoldenRecord, where: string): void {
    const text: string = record["text"];
    const prepared = prepareNer(text, this.tokenizer, tables, this.card.stripAccents, this.card.sequenceLength);
    const words = prepared.words.map((w) => `${w.text}@${w.start}-${w.end}`);
    this.check(where, "words", record["words"].map(([w, s, e]: [string, number, number]) => `${w}@${s}-${e}`), words);
    const length = prepared.inputs.length;
    this.check(where, "token_ids", record["token_ids"], Array.from(prepared.inputs.tokenIds.subarray(0, length)));
    this.check(where, "word_ids", record["word_ids"], Array.from(prepared.wordIds.subarray(0, length)));
    this.check(where, "num_truncated_words", record["num_truncated_words"], prepared.numTruncatedWords);
    const logits: number[][] = record["logits"];
    if (logits.length !== length) return this.check(where, "logits rows", length, logits.length);
    const entities = decodeNer(prepared, logits, this.card.labels, this.card.crf, text);
    this.check(where, "word_tags", record["word_tags"], entities.tags);
    const spans = entities.spans.map((s) => ({ type: s.type, start_char: s.startChar, end_char: s.endChar, text: s.text }));
    this.check(where, "entities", record["entities"], spans);
  }
}

/** `results.ts` against `keras-attn predict --json` on one directory's texts and logits. */
class PredictSuite {
  readonly mismatches: string[] = [];
  bitIdentical = 0;
  probabilities = 0;
  maxDifference = 0;
  /** Texts whose float32 CRF tags differ from the golden (float64) tags. */
  crfPrecisionDifferences = 0;

  constructor(
    readonly suite: Suite,
    readonly expected: GoldenRecord[],
  ) {}

  run(): void {
    expect(this.expected.length).toBe(this.suite.records.length);
    for (const [i, record] of this.suite.records.entries()) {
      const python = this.expected[i]!;
      const js = this.suite.card.isTagger ? this.nerResult(record) : this.classificationResult(record, python);
      if (JSON.stringify(js) !== JSON.stringify(python)) {
        this.mismatches.push(`${this.suite.name} record ${i + 1}: python=${JSON.stringify(python)} js=${JSON.stringify(js)}`);
      }
    }
  }

  /** The JS result; its probabilities replaced by Python's when within 1e-15 (counted). */
  private classificationResult(record: GoldenRecord, python: GoldenRecord): unknown {
    const result = classificationResult(this.suite.card.labels, Float32Array.from(record["logits"]));
    for (const [label, p] of Object.entries(result.probabilities)) {
      const difference = Math.abs(p - python["probabilities"][label]);
      this.probabilities += 1;
      this.bitIdentical += difference === 0 ? 1 : 0;
      this.maxDifference = Math.max(this.maxDifference, difference);
      if (difference <= 1e-15) result.probabilities[label] = python["probabilities"][label];
    }
    return result;
  }

  private nerResult(record: GoldenRecord): unknown {
    const { card, tokenizer } = this.suite;
    const text: string = record["text"];
    const prepared = prepareNer(text, tokenizer, tables, card.stripAccents, card.sequenceLength);
    const logits = (record["logits"] as number[][]).map((row) => Float32Array.from(row));
    const result = nerResult(prepared, logits, card, text);
    const tags = result.words.map((word) => word.tag);
    if (JSON.stringify(tags) !== JSON.stringify(record["word_tags"])) this.crfPrecisionDifferences += 1;
    return result;
  }

  get summary(): string {
    const name = this.suite.description;
    const compared = `${name}: ${this.expected.length} results compared, ${this.mismatches.length} mismatches`;
    if (this.suite.card.crf !== null) {
      return `${compared} (float32 CRF tags differ from the golden float64 ones on ${this.crfPrecisionDifferences} texts)`;
    }
    if (this.suite.card.isTagger) return compared;
    const max = this.maxDifference.toExponential(1);
    return `${compared} (probabilities: ${this.bitIdentical} of ${this.probabilities} bit-identical, max |diff| ${max})`;
  }
}

describe("golden parity", () => {
  let data: GoldenData;
  let suites: Suite[];

  beforeAll(() => {
    data = goldenData();
    suites = modelDirectories(data.root).map((directory) => new Suite(directory));
  });
  afterAll(() => data?.cleanUp());

  test("every golden record is reproduced", () => {
    expect(suites.length, `no model directories under ${data.root}`).toBeGreaterThan(0);
    const report: string[] = [];
    for (const suite of suites) {
      suite.run();
      const counts = `${suite.records.length} sentences compared, ${suite.mismatches.length} mismatches`;
      const line = `golden parity ${suite.description}: ${counts}`;
      report.push(line, ...suite.mismatches.slice(0, 10).map((m) => `  ${m}`));
      expect(suite.records.length, `${suite.name}: no records`).toBeGreaterThan(0);
    }
    console.log(report.join("\n"));
    const total = suites.reduce((sum, suite) => sum + suite.mismatches.length, 0);
    expect(total, `JavaScript differs from Python:\n${report.join("\n")}`).toBe(0);
  });

  test("results equal what keras-attn predict --json prints", () => {
    const report: string[] = [];
    let total = 0;
    for (const suite of suites) {
      const predict = new PredictSuite(suite, readJsonl(join(data.predictResults, `${suite.name}.jsonl`)));
      predict.run();
      report.push(`predict parity ${predict.summary}`, ...predict.mismatches.slice(0, 5).map((m) => `  ${m}`));
      total += predict.mismatches.length;
    }
    console.log(report.join("\n"));
    expect(total, `results.ts differs from keras-attn predict:\n${report.join("\n")}`).toBe(0);
  });

  test("the files embedded in a Python-written .tflite equal the side files", async () => {
    const report: string[] = [];
    // embedded_files.tflite of make_golden_vectors.py, or the model files of an export.
    const files = suites.flatMap((suite) =>
      readdirSync(suite.directory)
        .filter((name) => name.endsWith(".tflite"))
        .map((name) => ({ suite, name })),
    );
    expect(files.length, `no .tflite files beside the golden vectors under ${data.root}`).toBeGreaterThan(0);
    for (const { suite, name } of files) {
      const path = join(suite.directory, name);
      const embedded = await readModelAssets(readFileSync(path), `${suite.name}/${name}`);
      expect(embedded.card.raw).toEqual(suite.card.raw);
      expect(embedded.card.labels).toEqual(suite.card.labels);
      expect(embedded.card.crf?.transitions).toEqual(suite.card.crf?.transitions);
      expect(embedded.vocabulary).toEqual(lines(join(suite.directory, "vocab.txt")));
      expect(embedded.tokenizer.vocabularySize).toBe(suite.tokenizer.vocabularySize);
      report.push(`model file parity ${suite.name}/${name}: card, ${embedded.vocabulary.length} tokens, labels equal`);
    }
    console.log(report.join("\n"));
  });
});
