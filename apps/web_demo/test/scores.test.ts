/** Scores, results and code points: the small pieces, with hand-computed numbers. */
import { describe, expect, test } from "vitest";

import {
  CrfTransitions,
  ModelCard,
  TextTables,
  argmax,
  classificationResult,
  codePointsOf,
  nerResult,
  prepareNer,
  sliceCodePoints,
  softmax,
  stringOfCodePoints,
  toUtf16Index,
  topK,
  utf8Length,
} from "../src/lib/core";
import { cardText } from "./cards";

describe("scores", () => {
  test("argmax takes the first maximum, or the first NaN, as numpy", () => {
    expect(argmax([1, 3, 3, 2])).toBe(1);
    expect(argmax(new Float32Array([-1, NaN, 5, NaN]))).toBe(1);
    expect(() => argmax([])).toThrow("argmax of an empty array");
  });

  test("softmax is exp(x - max) / sum, stable for large logits", () => {
    expect(softmax([0, 0])).toEqual([0.5, 0.5]);
    const [p0, p1] = softmax([0, 1]);
    expect(p0).toBe(1 / (1 + Math.E));
    expect(p1).toBeCloseTo(Math.E / (1 + Math.E), 15);
    expect(softmax([1000, 1000, -Infinity])).toEqual([0.5, 0.5, 0]);
  });

  test("topK orders by value, then index", () => {
    expect(topK([0.1, 0.7, 0.2], 2)).toEqual([1, 2]);
    expect(topK([1, 2, 2, 1], 4)).toEqual([1, 2, 0, 3]);
    expect(topK([1], 5)).toEqual([0]);
    expect(() => topK([1], -1)).toThrow("k must be an integer >= 0");
  });
});

describe("results", () => {
  test("a classification result is the softmax of the logits and its argmax label", () => {
    const result = classificationResult(["negative", "positive"], new Float32Array([0, 1]));
    expect(result.label).toBe("positive");
    expect(Object.keys(result.probabilities)).toEqual(["negative", "positive"]);
    expect(result.probabilities["negative"]).toBe(softmax([0, 1])[0]);
    // Labels are keys as they are, "__proto__" included.
    expect(Object.keys(classificationResult(["__proto__", "b"], [2, 1]).probabilities)).toEqual(["__proto__", "b"]);
    expect(() => classificationResult(["a", "b"], [1])).toThrow("logits hold 1 scores, the card has 2 labels");
  });

  test("a tagger result has entities, words with tags, and the truncated words", () => {
    const card = ModelCard.parse(cardText({ length: 4 }));
    const tables = TextTables.load();
    const tokenizer = card.tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "peter"], tables);
    const text = "\u{1F600} Peter peter";
    const prepared = prepareNer(text, tokenizer, tables, card.stripAccents, card.sequenceLength);
    // [CLS] [UNK] peter [SEP]: the second "peter" is cut.
    const logits = [[0, 0, 0], [9, 0, 0], [0, 0, 9], [0, 0, 0]].map((row) => Float32Array.from(row));
    expect(nerResult(prepared, logits, card, text)).toEqual({
      entities: [{ type: "PER", start: 2, end: 7, text: "Peter" }],
      words: [
        { text: "\u{1F600}", start: 0, end: 1, tag: "O" },
        { text: "Peter", start: 2, end: 7, tag: "B-PER" },
        { text: "peter", start: 8, end: 13, tag: "O" },
      ],
      num_truncated_words: 1,
    });
  });

  test("a CRF tagger decodes in float32 as keras-attn predict, or float64 as the golden vectors", () => {
    const big = 2 ** 24;
    const crf = JSON.stringify({ transitions: [[0, 0], [0, 0]], start_transitions: [big, big], end_transitions: [0, 0] });
    const card = ModelCard.parse(cardText({ labels: '["O", "B-PER"]', crf }));
    const tables = TextTables.load();
    const tokenizer = card.tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "peter"], tables);
    const prepared = prepareNer("peter", tokenizer, tables, true, card.sequenceLength);
    const logits = [[0, 0], [0, 1]];
    expect(nerResult(prepared, logits, card, "peter").words[0]!.tag).toBe("O"); // 2^24 + 1 == 2^24 in float32
    expect(nerResult(prepared, logits, card, "peter", "float64").words[0]!.tag).toBe("B-PER");
    expect(card.crf).toBeInstanceOf(CrfTransitions);
  });
});

describe("code points", () => {
  test("offsets count code points, not UTF-16 units", () => {
    const text = "a\u{1F600}b\uD800c";
    expect(Array.from(codePointsOf(text))).toEqual([0x61, 0x1f600, 0x62, 0xd800, 0x63]);
    expect(toUtf16Index(text, 2)).toBe(3);
    expect(toUtf16Index(text, 5)).toBe(6);
    expect(() => toUtf16Index(text, 6)).toThrow("offset 6 is beyond the text's 5 code points");
    expect(sliceCodePoints(text, 1, 3)).toBe("\u{1F600}b");
    expect(stringOfCodePoints([0x1f600, 0x61], 0, 1)).toBe("\u{1F600}");
    expect([0x41, 0xe9, 0x20ac, 0x1f600, 0xd800].map(utf8Length)).toEqual([1, 2, 3, 4, 3]);
  });
});
