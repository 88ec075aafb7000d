/** Asset checks: card fields, vocabulary size, labels and the model's tensor shapes (Kotlin `ModelCardTest`). */
import { describe, expect, test } from "vitest";

import { ModelAssetError, ModelCard, TextTables } from "../src/lib/core";
import { cardText } from "./cards";

const tables = TextTables.load();
const CRF_3 = `{"transitions": [[0, 1, 2], [3, 4, 5], [6, 7, 8]], "start_transitions": [0, 0, 1], "end_transitions": [1, 0, 0]}`;

/** The message of the ModelAssetError `block` throws. */
function assetError(block: () => unknown): string {
  try {
    block();
  } catch (error) {
    if (error instanceof ModelAssetError) return error.message;
    throw error;
  }
  throw new Error("no ModelAssetError");
}

describe("ModelCard", () => {
  test("reads the fields the app needs", () => {
    const card = ModelCard.parse(cardText({ crf: CRF_3 }));
    expect(card.isTagger).toBe(true);
    expect(card.sequenceLength).toBe(8);
    expect(card.labels).toEqual(["O", "B-PER", "I-PER"]);
    expect(card.crf!.transitions[1]![2]).toBe(5);
    expect(card.inputNames).toEqual(["token_ids", "segment_ids", "padding_mask"]);
    expect(card.vocabularySize).toBe(5);
    expect(card.tokenizerSettings.maxWordCharacters).toBe(100);
    expect([card.lowercase, card.stripAccents]).toEqual([true, true]);
    expect(card.raw["metrics"]).toEqual({ accuracy: 0.9 });
    expect(ModelCard.parse(cardText({ task: "classification", labels: '["a", "b"]' })).crf).toBeNull();
  });

  test("mismatched assets are explained", () => {
    const card = ModelCard.parse(cardText());
    expect(assetError(() => card.tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]"], tables))).toBe(
      "vocab.txt has 4 tokens but the model card says vocabulary_size=5: copy vocab.txt from the same " +
        "export directory as the model",
    );
    expect(card.tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "x"], tables).clsId).toBe(2);
    expect(assetError(() => card.checkLabels(["O", "B-PER"]))).toMatch(/^labels\.txt \(2 labels\) differs/);
    card.checkLabels(["O", "B-PER", "I-PER", ""]);
    const shapes = { token_ids: [1, 8], segment_ids: [1, 8], padding_mask: [1, 16] };
    expect(assetError(() => card.checkModelShapes(shapes, [1, 8, 3], "model_int8.tflite"))).toMatch(
      /^model_int8\.tflite input "padding_mask" has shape \[1, 16\], the model card says \[1, 8\]/,
    );
    const good = { token_ids: [1, 8], segment_ids: [1, 8], padding_mask: [1, 8] };
    card.checkModelShapes(good, [1, 8, 3], "m.tflite");
    expect(assetError(() => card.checkModelShapes(good, [1, 8, 4], "m.tflite"))).toMatch(
      /^m\.tflite output has shape \[1, 8, 4\], expected \[1, 8, 3\]/,
    );
    expect(assetError(() => card.checkModelShapes({ text: [1] }, [1, 8, 3], "m.tflite"))).toMatch(
      /^m\.tflite has no input "token_ids" \(inputs: text\)/,
    );
  });

  test("bad cards are rejected", () => {
    const parse = (options: Parameters<typeof cardText>[0]) => () => ModelCard.parse(cardText(options));
    expect(assetError(parse({ labels: '["O", "PER"]' }))).toBe(
      'model_card.json: label "PER" is not an IOB2 tag (O, B-TYPE, I-TYPE)',
    );
    expect(assetError(parse({ labels: '["B-PER", "I-PER"]' }))).toBe('model_card.json: a tagger\'s labels need the "O" tag');
    const crf2 = `{"transitions": [[0, 1], [2, 3]], "start_transitions": [0, 0], "end_transitions": [0, 0]}`;
    expect(assetError(parse({ crf: crf2 }))).toBe("model_card.json: crf: 2 tags, but 3 labels");
    const crf1 = `{"transitions": [[0]], "start_transitions": [0], "end_transitions": [0]}`;
    expect(assetError(parse({ task: "classification", labels: '["a", "b"]', crf: crf1 }))).toBe(
      'model_card.json: only a tagger can have "crf" transitions',
    );
    const ragged = `{"transitions": [[0, 1, 2], [3, 4]], "start_transitions": [0, 0, 0], "end_transitions": [0, 0, 0]}`;
    expect(assetError(parse({ crf: ragged }))).toMatch(/^model_card\.json: crf: CRF weights must be transitions \(K, K\)/);
    expect(assetError(parse({ length: 2 }))).toBe("model_card.json: sequence_length must be >= 3, got 2");
    expect(assetError(parse({ task: "qa" }))).toBe(
      'model_card.json: task "qa" has no on-device pipeline (classification or ner)',
    );
    expect(assetError(parse({ labels: "[]" }))).toBe('model_card.json: "labels" is empty');
    expect(assetError(parse({ labels: '"O"' }))).toBe('model_card.json: "labels" must be an array, got a string');
    expect(assetError(parse({ vocabularySize: 2 }))).toBe(
      "model_card.json: tokenizer: cls_token_id=2 is outside the vocabulary (size 2)",
    );
  });

  test("malformed JSON and fields name the file and the place", () => {
    expect(assetError(() => ModelCard.parse('{"format": 1}', "m.tflite:model_card.json"))).toBe(
      'm.tflite:model_card.json: "format" must be a string, got the number 1',
    );
    expect(assetError(() => ModelCard.parse('{"task": "ner"}'))).toBe('model_card.json: missing field "format"');
    expect(assetError(() => ModelCard.parse("[1]"))).toBe("model_card.json: the card must be an object, got an array");
    expect(assetError(() => ModelCard.parse('{\n "a": 1,\n "b": 2 x\n}'))).toMatch(/^model_card\.json:3:9: not valid JSON \(/);
    const text = cardText().replace('"format": "keras-attn model card 1"', '"format": "keras-attn model card 0"');
    expect(assetError(() => ModelCard.parse(text))).toMatch(/export the model with this keras-attn version$/);
  });
});
