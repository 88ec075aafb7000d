/** The card, vocabulary and labels read from a model file's embedded zip (Kotlin `ModelFileTest`). */
import { crc32, deflateRawSync } from "node:zlib";
import { describe, expect, test } from "vitest";

import {
  ModelAssetError,
  isTFLite,
  readAssociatedFiles,
  readModelAssets,
  readTranslationAssets,
  sourceBucket,
  sourceIds,
  translationText,
} from "../src/lib/core";
import { cardText } from "./cards";

const card = cardText({ task: "classification", labels: '["neg", "pos"]', vocabularySize: 6 });
const vocabulary = "[PAD]\n[UNK]\n[CLS]\n[SEP]\ngood\ncafe\n";
const FLATBUFFER = Buffer.from("\x08\x00\x00\x00TFL3 model bytes", "latin1");

/** Little-endian header bytes: `[offset, byte count, value]` fields in a zeroed buffer. */
function header(size: number, fields: [number, 2 | 4, number][]): Buffer {
  const bytes = Buffer.alloc(size);
  for (const [at, count, value] of fields) {
    if (count === 2) bytes.writeUInt16LE(value, at);
    else bytes.writeUInt32LE(value, at);
  }
  return bytes;
}

/**
 * A zip archive of `files` (name -> content): deflated (method 8) or stored (0), entry
 * offsets counted from the archive's start (as java.util.zip writes them after a prefix).
 */
function zip(files: Record<string, string | Uint8Array>, method: 0 | 8 = 8): Buffer {
  const parts: Buffer[] = [];
  const directory: Buffer[] = [];
  let offset = 0;
  for (const [name, content] of Object.entries(files)) {
    const data = Buffer.from(typeof content === "string" ? Buffer.from(content, "utf-8") : content);
    const packed = method === 8 ? deflateRawSync(data) : data;
    const nameBytes = Buffer.from(name, "utf-8");
    const sizes = (at: number): [number, 2 | 4, number][] => [
      [at, 4, crc32(data)], [at + 4, 4, packed.length], [at + 8, 4, data.length], [at + 12, 2, nameBytes.length],
    ];
    const local = header(30, [[0, 4, 0x04034b50], [4, 2, 20], [8, 2, method], ...sizes(14)]);
    const central = header(46, [[0, 4, 0x02014b50], [4, 2, 20], [6, 2, 20], [10, 2, method], ...sizes(16), [42, 4, offset]]);
    parts.push(local, nameBytes, packed);
    directory.push(central, nameBytes);
    offset += local.length + nameBytes.length + packed.length;
  }
  const count = directory.length / 2;
  const size = directory.reduce((sum, part) => sum + part.length, 0);
  const end = header(22, [[0, 4, 0x06054b50], [8, 2, count], [10, 2, count], [12, 4, size], [16, 4, offset]]);
  return Buffer.concat([...parts, ...directory, end]);
}

const modelFile = (files: Record<string, string | Uint8Array>, method: 0 | 8 = 8) =>
  new Uint8Array(Buffer.concat([FLATBUFFER, zip(files, method)]));

async function assetError(promise: Promise<unknown>): Promise<string> {
  const error = await promise.then(() => undefined, (e: unknown) => e);
  if (error instanceof ModelAssetError) return error.message;
  throw new Error(`no ModelAssetError: ${String(error)}`);
}

describe("model files", () => {
  test("reads the embedded card, vocabulary and labels (deflated and stored)", async () => {
    for (const method of [8, 0] as const) {
      const files = { "model_card.json": card, "vocab.txt": vocabulary, "labels.txt": "neg\npos\n" };
      const assets = await readModelAssets(modelFile(files, method));
      expect(assets.card.labels).toEqual(["neg", "pos"]);
      expect(assets.card.sequenceLength).toBe(8);
      expect(assets.vocabulary.length).toBe(6);
      expect(Array.from(assets.tokenizer.encode("Café GOOD", 8).tokenIds.subarray(0, 4))).toEqual([2, 5, 4, 3]);
    }
  });

  test("associated files keep their bytes and order; a file without a zip has none", async () => {
    const files = await readAssociatedFiles(modelFile({ "b.txt": "é\n", "a.txt": "" }));
    expect([...files.keys()]).toEqual(["b.txt", "a.txt"]);
    expect(Array.from(files.get("b.txt")!)).toEqual([0xc3, 0xa9, 0x0a]);
    expect((await readAssociatedFiles(new Uint8Array(64))).size).toBe(0);
    expect(isTFLite(FLATBUFFER)).toBe(true);
    expect(isTFLite(new Uint8Array(4))).toBe(false);
  });

  test("files that are not ours, or with bad embedded files, are clear errors", async () => {
    const notModel = new TextEncoder().encode("not a model");
    expect(await assetError(readModelAssets(notModel, "notes.txt"))).toMatch(
      /^notes\.txt is not a TFLite file \(no TFL3 identifier/,
    );
    expect(await assetError(readModelAssets(FLATBUFFER, "plain.tflite"))).toBe(
      "plain.tflite embeds no model_card.json (it embeds no files): it is not a self-describing keras-attn model; " +
        "export the model with `keras-attn export`, which embeds model_card.json, vocab.txt and labels.txt in every " +
        "model_<variant>.tflite",
    );
    const noLabels = modelFile({ "model_card.json": card, "vocab.txt": vocabulary });
    expect(await assetError(readModelAssets(noLabels))).toMatch(
      /^model\.tflite embeds no labels\.txt \(embedded files: model_card\.json, vocab\.txt\)/,
    );
    const otherLabels = modelFile({ "model_card.json": card, "vocab.txt": vocabulary, "labels.txt": "a\nb\n" });
    expect(await assetError(readModelAssets(otherLabels))).toMatch(
      /^model\.tflite:labels\.txt \(2 labels\) differs from the model card/,
    );
    const badCard = modelFile({ "model_card.json": "{", "vocab.txt": vocabulary, "labels.txt": "neg\npos\n" });
    expect(await assetError(readModelAssets(badCard))).toMatch(/^model\.tflite:model_card\.json:1:2: not valid JSON/);
    const latin1 = modelFile({ "model_card.json": card, "vocab.txt": new Uint8Array([0x63, 0x61, 0x66, 0xe9]) });
    expect(await assetError(readModelAssets(latin1))).toBe(
      "model.tflite:vocab.txt is not UTF-8 text: the file is damaged; export the model again",
    );
  });

  test("damaged archives are clear errors", async () => {
    const good = modelFile({ "model_card.json": card, "vocab.txt": vocabulary, "labels.txt": "neg\npos\n" });
    const tail = new Uint8Array([...FLATBUFFER, ...good.subarray(good.length - 40)]); // directory cut
    expect(await assetError(readModelAssets(tail, "m.tflite"))).toBe("m.tflite: damaged zip directory of the embedded files");
    const stored = modelFile({ "vocab.txt": vocabulary }, 0);
    stored[FLATBUFFER.length + 8] = 12; // compression method 12 (bzip2) in the local and
    stored.set([12], stored.length - 22 - 46 - "vocab.txt".length + 10); // central headers
    expect(await assetError(readAssociatedFiles(stored, "m.tflite"))).toBe(
      "m.tflite: vocab.txt uses zip compression method 12 (stored or deflated expected)",
    );
    const corrupt = modelFile({ "vocab.txt": vocabulary });
    corrupt.fill(0xff, FLATBUFFER.length + 30 + "vocab.txt".length, FLATBUFFER.length + 34 + "vocab.txt".length);
    expect(await assetError(readAssociatedFiles(corrupt, "m.tflite"))).toMatch(
      /^m\.tflite: vocab\.txt: (damaged deflated data|deflated data gives)/,
    );
  });

  test("a translation file is read by readTranslationAssets, and refused by readModelAssets", async () => {
    const translationCard = JSON.stringify({
      task: "seq2seq", max_length: 8, target_max_length: 6, source_lengths: [8, 4], lowercase: false,
      num_beams: 3, length_penalty: 0.6, bos_token_id: 2, eos_token_id: 3, pad_token_id: 0, joiner_token: "[JOIN]",
      signatures: { encode: "encode_{S}", decode_step: "decode_step_{S}" } });
    const translation = modelFile({ "model_card.json": translationCard, "vocab.txt": vocabulary + "[JOIN]\n." });
    const assets = await readTranslationAssets(translation, "translation_int8.tflite");
    expect(assets.card).toMatchObject({ maxLength: 8, targetMaxLength: 6, sourceLengths: [4, 8], numBeams: 3,
      lengthPenalty: 0.6, bosTokenId: 2, eosTokenId: 3, padTokenId: 0, decodeStepSignature: "decode_step_{S}" });
    expect(assets.vocabulary.length).toBe(8);
    expect(Array.from(assets.pieces.encode("good."))).toEqual([4, 6, 7]);
    // Sources: pieces cut to max_length - 1, then [SEP]; the shortest length that holds them.
    expect(Array.from(sourceIds(assets.pieces, assets.card, "good."))).toEqual([4, 6, 7, 3]);
    expect(Array.from(sourceIds(assets.pieces, assets.card, "good good good good good good good good"))).toEqual(
      [4, 4, 4, 4, 4, 4, 4, 3]);
    expect([1, 4, 5, 8].map((n) => sourceBucket(assets.card, n))).toEqual([4, 4, 8, 8]);
    expect(() => sourceBucket(assets.card, 9)).toThrow("longer than the file's longest source length 8");
    // Translations: up to the first [SEP].
    expect(translationText(assets.pieces, assets.card, [5, 4, 6, 7, 3, 4, 0])).toBe("cafe good.");
    expect(await assetError(readModelAssets(translation, "translation_int8.tflite"))).toMatch(
      /^translation_int8\.tflite is a translation file \(task "seq2seq" in its model_card\.json\): load it with loadTranslator/);
    const classifier = modelFile({ "model_card.json": card, "vocab.txt": vocabulary, "labels.txt": "neg\npos\n" });
    expect(await assetError(readTranslationAssets(classifier, "model.tflite"))).toMatch(
      /^model\.tflite:model_card\.json: task "classification" is not "seq2seq": load a classifier or tagger with loadModel/);
    const badIds = modelFile({ "model_card.json": translationCard.replace('"eos_token_id":3', '"eos_token_id":9'),
      "vocab.txt": vocabulary + "[JOIN]\n" });
    expect(await assetError(readTranslationAssets(badIds, "t.tflite"))).toBe(
      "t.tflite:model_card.json: eos_token_id=9 is outside the vocabulary (size 7)");
  });
});
