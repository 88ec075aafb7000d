/**
 * The generation path against Python, in Node:
 *
 * - the pure core: the text codec (characters with [UNK], bytes with multibyte characters
 *   streamed and invalid UTF-8 replaced as Python's `errors="replace"`, WordPiece's
 *   detokenize), the logit processors and the sampler (`keras_attn/generation.py`'s doctests),
 *   the seeded uniforms, the prompt limits with Python's messages;
 * - the library (`loadGenerator`, LiteRT.js on the wasm accelerator) on the toy language
 *   model export of tools/make_test_exports.py (`$WEB_TEST_EXPORTS/generation`, default
 *   runs/web_test/generation, which `make test-web` writes before running vitest): prompt
 *   ids, greedy ids, texts and streamed pieces of Python LiteRT (`file_generator`,
 *   tools/generation_reference.py) on its prompts, for the fp32 and int8 files; fp32 logits
 *   step by step; seeded sampling (repeats per seed, differs across seeds, draws only top-k
 *   tokens of the logits at each step).
 *
 * Python runs through `$PYTHON` (default .venv/bin/python), as test/golden.ts.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, test } from "vitest";

import {
  GenerationError, ModelAssetError, TextCodec, TextStream, TextTables, checkSampling, newTokenBudget,
  processLogits, readGenerationAssets, sampleFromLogits, seededUniforms, topKFilter, topPFilter,
} from "../src/lib/core";
import { loadGenerator, type GenerationModel } from "../src/lib/generator";
import { REPO, python } from "./golden";
import { loadLiteRtInNode } from "./litertNode";

const REFERENCE = "apps/web_demo/tools/generation_reference.py";
const EXPORTS = process.env["WEB_TEST_EXPORTS"] ?? join(REPO, "runs/web_test");
const TOY = join(EXPORTS, "generation", "export");
const FILES = ["generation_fp32.tflite", "generation_int8.tflite"] as const;
const HAS_TOY = FILES.every((name) => existsSync(join(TOY, name)));

const CHARACTERS = JSON.stringify({ kind: "characters", symbols: ["[PAD]", "[UNK]", "\n", " ", "b", "e", "o", "t", "😀"] });
const BYTES = JSON.stringify({ kind: "bytes", symbols: ["[PAD]", ...Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`)] });

/** Every piece a stream hands out for `ids`, the last from `finish`. */
function streamPieces(codec: TextCodec, ids: number[]): string[] {
  const stream = new TextStream(codec);
  const pieces = [...ids.map((id) => stream.add(id)), stream.finish()];
  return pieces.filter((p) => p !== "");
}

describe("text codec (Python TextCodec, CharacterTokenizer)", () => {
  test("characters: one id per code point, [UNK] for unseen characters, decoded as U+FFFD", () => {
    const codec = TextCodec.fromCharacters(CHARACTERS);
    expect(codec.kind).toBe("characters");
    expect(codec.stopTokenIds).toEqual([]);
    expect(Array.from(codec.encode("be to"))).toEqual([4, 5, 3, 7, 6]);
    expect(Array.from(codec.encode("bez\n"))).toEqual([4, 5, 1, 2]);
    // An astral character is one code point (two UTF-16 units): one id.
    expect(Array.from(codec.encode("😀b🙂"))).toEqual([8, 4, 1]);
    expect(codec.decode([4, 0, 5, 1, 8])).toBe("be\ufffd😀");
    expect(() => codec.decode([9])).toThrow(/outside the vocabulary/);
  });

  test("characters streaming: a trailing [UNK] waits for the next token or the end", () => {
    const codec = TextCodec.fromCharacters(CHARACTERS);
    const stream = new TextStream(codec);
    expect([stream.add(7), stream.add(1), stream.add(6), stream.add(1)]).toEqual(["t", "", "\ufffdo", ""]);
    expect(stream.finish()).toBe("\ufffd");
    expect(stream.text).toBe("t\ufffdo\ufffd");
  });

  test("bytes: byte b is id b + 1; multibyte characters stream whole; invalid UTF-8 as Python's errors='replace'", () => {
    const codec = TextCodec.fromCharacters(BYTES);
    expect(codec.kind).toBe("bytes");
    const ids = (text: string) => Array.from(codec.encode(text));
    expect(ids("é")).toEqual([196, 170]); // CharacterTokenizer("bytes").encode("é")
    expect(ids("a€😀")).toEqual([98, 227, 131, 173, 241, 160, 153, 129]);
    expect(streamPieces(codec, ids("aé€😀b"))).toEqual(["a", "é", "€", "😀", "b"]);
    // Each state: a character cut inside its bytes is held back, never shown as U+FFFD.
    const stream = new TextStream(codec);
    expect(ids("€").map((id) => stream.add(id))).toEqual(["", "", "€"]);
    // An unfinished character at the end: the replacement character, from finish.
    expect(streamPieces(codec, [98, 227, 131])).toEqual(["a", "\ufffd"]);
    // bytes.decode("utf-8", errors="replace") in Python 3.12, one row per case.
    const python: [number[], string][] = [[[195], "\ufffd"], [[97, 195, 98], "a\ufffdb"], [[226, 130], "\ufffd"],
      [[226, 130, 172], "\u20ac"], [[240, 159, 152, 128], "\ud83d\ude00"], [[240, 159, 152], "\ufffd"],
      [[237, 160, 128], "\ufffd\ufffd\ufffd"], [[255, 254], "\ufffd\ufffd"], [[192, 175], "\ufffd\ufffd"],
      [[239, 187, 191, 120], "\ufeffx"]];
    for (const [bytes, text] of python) expect(codec.decode(bytes.map((b) => b + 1)), bytes.join(" ")).toBe(text);
    expect(codec.decode([0, 98, 0])).toBe("a"); // padding dropped
  });

  test("wordpiece: tf-text's detokenize (## glued, a leading ## kept, [PAD] dropped), [SEP] stops", () => {
    const vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##a", "b", "##c", ",", ".", "hello"];
    const codec = TextCodec.fromWordPieces(vocabulary.join("\n") + "\n", true, TextTables.load());
    expect(codec.stopTokenIds).toEqual([3]);
    expect(Array.from(codec.encode("Hello, a b."))).toEqual([11, 9, 5, 7, 10]);
    // Python WordPieceTokenizer.detokenize on the same ids.
    expect(codec.decode([6, 7])).toBe("##a b");
    expect(codec.decode([5, 6, 8, 9, 11])).toBe("aac , hello");
    expect(codec.decode([5, 1, 10, 3, 11])).toBe("a [UNK] . [SEP] hello");
    expect(codec.decode([5, 0, 6])).toBe("aa");
    expect(codec.decode([9, 9, 6])).toBe(", ,a");
    expect(streamPieces(codec, [11, 6, 3])).toEqual(["hello", "a"]);
  });

  test("bad vocabulary files are ModelAssetErrors", () => {
    expect(() => TextCodec.fromCharacters('{"kind": "words", "symbols": []}')).toThrow(ModelAssetError);
    expect(() => TextCodec.fromCharacters("[1, 2]")).toThrow(ModelAssetError);
    expect(() => TextCodec.fromCharacters('{"kind": "bytes", "symbols": ["[PAD]"]}')).toThrow(/257 symbols/);
  });
});

describe("sampling (keras_attn/generation.py)", () => {
  test("the logit processors: Python's doctests, ties kept", () => {
    expect(Array.from(topKFilter([1, 3, 2, 0], 2))).toEqual([-Infinity, 3, 2, -Infinity]);
    expect(Array.from(topKFilter([1, 3, 3, 0], 1))).toEqual([-Infinity, 3, 3, -Infinity]);
    expect(Array.from(topKFilter([1, 2], 5))).toEqual([1, 2]);
    const kept = topPFilter([0.1, 0.5, 0.15, 0.25].map(Math.log), 0.7);
    expect(Array.from(kept, Number.isFinite)).toEqual([false, true, false, true]);
    expect(Array.from(topPFilter([0.1, 0.5, 0.15, 0.25].map(Math.log), 0.01), Number.isFinite)).toEqual([false, true, false, false]);
    expect(Array.from(processLogits([0, 1, 2], { temperature: 0.5 }))).toEqual([0, 2, 4]);
    // Temperature, then top-k, then top-p.
    expect(Array.from(processLogits([0, 1, 2, 3], { temperature: 2, topK: 3, topP: 1 }))).toEqual([-Infinity, 0.5, 1, 1.5]);
  });

  test("sampleFromLogits inverts the CDF: Python's doctest; probability 0 is never drawn", () => {
    expect(sampleFromLogits([0.5, 0, 0.5].map(Math.log), 0.6)).toBe(2);
    expect(sampleFromLogits([0.2, 0.8, 0].map(Math.log), 0.1)).toBe(0);
    expect(sampleFromLogits([0.2, 0.8, 0].map(Math.log), 0.999999999)).toBe(1);
    expect(sampleFromLogits([-Infinity, 1, -Infinity], 0)).toBe(1);
  });

  test("seeded uniforms: in [0, 1), the same per seed, other seeds other draws, a prefix for fewer", () => {
    const a = seededUniforms(7, 1000);
    expect(Array.from(a).every((u) => u >= 0 && u < 1)).toBe(true);
    expect(Array.from(seededUniforms(7, 1000))).toEqual(Array.from(a));
    expect(Array.from(seededUniforms(7, 10))).toEqual(Array.from(a.subarray(0, 10)));
    expect(Array.from(seededUniforms(8, 10))).not.toEqual(Array.from(a.subarray(0, 10)));
    expect(Array.from(seededUniforms(2 ** 40 + 7, 10))).not.toEqual(Array.from(a.subarray(0, 10)));
    const mean = a.reduce((s, u) => s + u, 0) / a.length;
    expect(Math.abs(mean - 0.5)).toBeLessThan(0.05);
  });

  test("settings are checked as Python's _check_sampler", () => {
    expect(() => checkSampling({ topK: 3 })).toThrow(/no effect on greedy decoding; pass sampler: "sample".*topK=3/);
    expect(() => checkSampling({ sampler: "beam" as "greedy" })).toThrow(/sampler must be "greedy" or "sample"/);
    expect(() => checkSampling({ sampler: "sample", topK: 0 })).toThrow(/topK must be an integer >= 1/);
    expect(() => checkSampling({ sampler: "sample", topP: 1.5 })).toThrow(/topP must be a number in \(0, 1\]/);
    expect(() => checkSampling({ sampler: "sample", temperature: 0 })).toThrow(/temperature must be a number > 0/);
    expect(() => checkSampling({ sampler: "sample", seed: 1.5 })).toThrow(/seed must be an integer/);
    expect(() => checkSampling({ temperature: 1 })).not.toThrow();
  });

  test("the prompt limits, with Python's messages", () => {
    expect(newTokenBudget(5, 32)).toBe(27);
    expect(newTokenBudget(5, 32, 3)).toBe(3);
    expect(() => newTokenBudget(0, 32)).toThrow(new GenerationError(
      "the prompt is empty: give at least one character (or word) for the model to continue"));
    expect(() => newTokenBudget(32, 32)).toThrow(
      "the prompt is 32 tokens, the model has 32 positions: shorten the prompt (its last words carry most of what comes next)");
    expect(() => newTokenBudget(30, 32, 5)).toThrow(
      "5 new tokens after a prompt of 30 do not fit the model's 32 positions: ask for at most 2");
    expect(() => newTokenBudget(3, 32, 0)).toThrow(/maxNewTokens must be an integer >= 1/);
  });
});

interface GenerationRecord {
  prompt: string;
  prompt_ids: number[];
  greedy: number[];
  text: string;
  pieces: string[];
}
interface FileReference {
  card: { max_length: number; vocabulary_size: number };
  max_length: number;
  records: GenerationRecord[];
  logits: { ids: number[]; logits: number[][] };
}

describe.skipIf(!HAS_TOY)(
  `generation files against Python LiteRT (skipped when ${TOY} is missing: ` +
    "python apps/web_demo/tools/make_test_exports.py DIR, then WEB_TEST_EXPORTS=DIR)",
  () => {
    const work = mkdtempSync(join(tmpdir(), "keras-attn-generation-"));
    const generators: Record<string, GenerationModel> = {};
    let reference: Record<string, FileReference>;

    beforeAll(async () => {
      const out = join(work, "generation.json");
      const result = spawnSync(python(), [REFERENCE, out, TOY, "--files", FILES.join(",")], {
        cwd: REPO, encoding: "utf-8", env: { ...process.env, TF_CPP_MIN_LOG_LEVEL: "2" } });
      if (result.error !== undefined || result.status !== 0) {
        throw new Error(`cannot run ${python()} ${REFERENCE} ` +
          `(${result.error?.message ?? (result.stderr ?? "").slice(-2000)}): set PYTHON=the project's Python (make install)`);
      }
      reference = JSON.parse(readFileSync(out, "utf-8")).files;
      await loadLiteRtInNode();
      for (const name of FILES) {
        generators[name] = await loadGenerator(new Uint8Array(readFileSync(join(TOY, name))), { name });
      }
    });
    afterAll(() => {
      for (const generator of Object.values(generators)) generator.delete();
      rmSync(work, { recursive: true, force: true });
    });

    test("the card, the positions and the prompts' ids are Python's", () => {
      for (const name of FILES) {
        const generator = generators[name]!;
        const { card, max_length, records } = reference[name]!;
        expect(generator.positions).toBe(max_length);
        expect(generator.card.maxLength).toBe(card.max_length);
        expect(generator.vocabularySize).toBe(card.vocabulary_size);
        expect(generator.codec.kind).toBe("characters");
        for (const record of records) {
          expect(Array.from(generator.codec.encode(record.prompt)), JSON.stringify(record.prompt)).toEqual(record.prompt_ids);
        }
        expect(records.some((r) => r.prompt_ids.includes(1)), "a prompt with an [UNK] character").toBe(true);
      }
    });

    test("fp32: the logits after each prompt token are Python LiteRT's", async () => {
      const { ids, logits } = reference["generation_fp32.tflite"]!.logits;
      const ours = await generators["generation_fp32.tflite"]!.sequenceLogits(ids);
      let worst = 0;
      ours.forEach((row, t) => row.forEach((z, v) => { worst = Math.max(worst, Math.abs(z - logits[t]![v]!)); }));
      expect(worst).toBeLessThan(1e-4);
    });

    for (const name of FILES) {
      test(`${name}: greedy ids, text and streamed pieces are Python LiteRT's`, async () => {
        const generator = generators[name]!;
        for (const record of reference[name]!.records) {
          const pieces: string[] = [];
          const steps: number[] = [];
          const out = await generator.generate(record.prompt, {
            onText: async (piece, progress) => {
              pieces.push(piece);
              steps.push(progress.step);
              expect(progress.text).toBe(pieces.join(""));
            },
          });
          const what = `${name} ${JSON.stringify(record.prompt)}`;
          expect(Array.from(out.ids), what).toEqual(record.greedy);
          expect(out.text, what).toBe(record.text);
          expect(pieces, what).toEqual(record.pieces);
          expect(pieces.join(""), what).toBe(out.text);
          // Every position is used (no stop token), one decode_step call per token but the last.
          expect(record.prompt_ids.length + out.ids.length).toBe(generator.positions);
          expect(out.modelCalls).toBe(record.prompt_ids.length + out.ids.length - 1);
          expect(out.seed).toBeNull();
          expect(out.timing.msPerToken).toBeGreaterThan(0);
        }
      });
    }

    test("maxNewTokens: a prefix of the greedy continuation; errors for bad prompts and settings", async () => {
      const generator = generators["generation_fp32.tflite"]!;
      const record = reference["generation_fp32.tflite"]!.records[0]!;
      const out = await generator.generate(record.prompt, { maxNewTokens: 5 });
      expect(Array.from(out.ids)).toEqual(record.greedy.slice(0, 5));
      await expect(generator.generate("")).rejects.toThrow(GenerationError);
      await expect(generator.generate("x".repeat(generator.positions))).rejects.toThrow(
        `the prompt is ${generator.positions} tokens, the model has ${generator.positions} positions`);
      await expect(generator.generate("to be", { maxNewTokens: generator.positions })).rejects.toThrow(
        `ask for at most ${generator.positions - 5}`);
      await expect(generator.generate("to be", { topK: 3 })).rejects.toThrow(/no effect on greedy decoding/);
      // The generator still works after refused calls.
      expect(Array.from((await generator.generate(record.prompt, { maxNewTokens: 3 })).ids)).toEqual(record.greedy.slice(0, 3));
    });

    test("sampling: a seed repeats its text, seeds differ, only top-k tokens of the logits are drawn", async () => {
      for (const name of FILES) {
        const generator = generators[name]!;
        const prompt = "to be";
        const promptIds = Array.from(generator.codec.encode(prompt));
        const k = 3;
        const texts = new Set<string>();
        for (const seed of [0, 1, 2, 3]) {
          const a = await generator.generate(prompt, { sampler: "sample", topK: k, seed });
          const b = await generator.generate(prompt, { sampler: "sample", topK: k, seed });
          expect(Array.from(b.ids), `${name} seed ${seed} repeats`).toEqual(Array.from(a.ids));
          expect(a.seed).toBe(seed);
          texts.add(a.text);
          // Each drawn token is among the k largest logits after what precedes it.
          const logits = await generator.sequenceLogits([...promptIds, ...a.ids]);
          a.ids.forEach((token, i) => {
            const row = Array.from(logits[promptIds.length - 1 + i]!);
            const kth = row.slice().sort((x, y) => y - x)[k - 1]!;
            expect(row[token]!, `${name} seed ${seed} step ${i}`).toBeGreaterThanOrEqual(kth);
          });
        }
        expect(texts.size, `${name}: four seeds give more than one text`).toBeGreaterThan(1);
        // A seed's first tokens do not depend on maxNewTokens.
        const long = await generator.generate(prompt, { sampler: "sample", topK: k, seed: 5 });
        const short = await generator.generate(prompt, { sampler: "sample", topK: k, seed: 5, maxNewTokens: 4 });
        expect(Array.from(short.ids)).toEqual(Array.from(long.ids.subarray(0, 4)));
        // Without a seed: a random one, reported, which repeats the text.
        const random = await generator.generate(prompt, { sampler: "sample", temperature: 1.5, topP: 0.9 });
        expect(Number.isInteger(random.seed)).toBe(true);
        const again = await generator.generate(prompt, { sampler: "sample", temperature: 1.5, topP: 0.9, seed: random.seed });
        expect(again.text).toBe(random.text);
      }
    });

    test("a file of another task is refused with what to do", async () => {
      const translation = join(EXPORTS, "translation", "export", "translation_fp32.tflite");
      if (!existsSync(translation)) return;
      await expect(readGenerationAssets(new Uint8Array(readFileSync(translation)), "translation_fp32.tflite"))
        .rejects.toThrow(/task "seq2seq" is not "causal_lm": load a language model file with loadGenerator/);
      await expect(readGenerationAssets(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8]), "x.tflite"))
        .rejects.toThrow(/not a TFLite file/);
    });
  },
);
