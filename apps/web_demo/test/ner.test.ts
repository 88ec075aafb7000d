/** Word splitting, alignment, IOB2 repair and entity spans (Kotlin `NerTest`). */
import { describe, expect, test } from "vitest";

import {
  type EntitySpan,
  TextTables,
  WordPieceTokenizer,
  decodeNer,
  entitySpans,
  firstPiecePositions,
  prepareNer,
  repairIob2,
  splitWords,
} from "../src/lib/core";

const tables = TextTables.load();
const vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "peter", "visits", "paris", "new", "york", "##s", "."];
const tokenizer = new WordPieceTokenizer(vocabulary, true, tables);
const labels = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"];

const words = (text: string, stripAccents = false) =>
  splitWords(text, tables, stripAccents).map((w) => `${w.text}@${w.start}-${w.end}`);
const describeSpans = (spans: readonly EntitySpan[]) =>
  spans.map((s) => `${s.type}[${s.startChar}, ${s.endChar}) "${s.text}"`);

describe("NER", () => {
  test("words follow BERT basic tokenization with code-point offsets", () => {
    expect(words("Hi, J.R. Tolkien!")).toEqual([
      "Hi@0-2", ",@2-3", "J@4-5", ".@5-6", "R@6-7", ".@7-8", "Tolkien@9-16", "!@16-17",
    ]);
    // CJK ideographs are single words; U+200B is removed inside a word, which keeps its span.
    expect(words("北京 a\u200Bb")).toEqual(["北@0-1", "京@1-2", "ab@3-6"]);
    // An astral character is one code point (two UTF-16 units).
    expect(words("\u{1F600}x y")).toEqual(["\u{1F600}x@0-2", "y@3-4"]);
    // Combining marks: kept cased, removed uncased (a span ends at the last kept character);
    // U+2028 separates.
    expect(words("e\u0301\u2028x")).toEqual(["e\u0301@0-2", "x@3-4"]);
    expect(words("e\u0301\u2028x", true)).toEqual(["e@0-1", "x@3-4"]);
  });

  test("the repair follows the conlleval rule", () => {
    expect(repairIob2(["O", "I-PER", "I-PER", "B-LOC", "I-ORG"])).toEqual({
      tags: ["O", "B-PER", "I-PER", "B-LOC", "B-ORG"],
      repairs: 2,
    });
    expect(repairIob2(["I-LOC"])).toEqual({ tags: ["B-LOC"], repairs: 1 });
    expect(repairIob2(["B-PER", "I-LOC", "I-LOC"])).toEqual({ tags: ["B-PER", "B-LOC", "I-LOC"], repairs: 1 });
    expect(repairIob2([])).toEqual({ tags: [], repairs: 0 });
    expect(() => repairIob2(["O", "X-PER"])).toThrow(
      "malformed tag \"X-PER\" at position 1: expected 'O', 'B-<TYPE>' or 'I-<TYPE>'",
    );
  });

  test("spans join the words of one entity", () => {
    const text = "Peter visits New York.";
    const split = splitWords(text, tables, true);
    expect(describeSpans(entitySpans(["B-PER", "O", "B-LOC", "I-LOC", "O"], split, text))).toEqual([
      'PER[0, 5) "Peter"',
      'LOC[13, 21) "New York"',
    ]);
    // Strict reading: an I- after O belongs to no entity (repair first to keep it).
    expect(entitySpans(["O", "O", "I-LOC", "I-LOC", "O"], split, text)).toEqual([]);
    expect(() => entitySpans(["O"], split, text)).toThrow("need one tag per word: 1 tags, 5 words");
  });

  test("spans of astral text are code points", () => {
    const text = "\u{1F600} Peter";
    const spans = entitySpans(["O", "B-PER"], splitWords(text, tables, false), text);
    expect(describeSpans(spans)).toEqual(['PER[2, 7) "Peter"']);
  });

  test("preparation aligns pieces to words and counts cut words", () => {
    const prepared = prepareNer("Peter visits Paris .", tokenizer, tables, true, 5);
    // [CLS] peter visits paris [SEP]: "." does not fit.
    expect(Array.from(prepared.inputs.tokenIds)).toEqual([2, 4, 5, 6, 3]);
    expect(Array.from(prepared.wordIds)).toEqual([-1, 0, 1, 2, -1]);
    expect(prepared.numTruncatedWords).toBe(1);
    const twoPieces = prepareNer("Paris Peters", tokenizer, tables, true, 4);
    // "peters" = peter ##s: its first piece fits, so it is not a truncated word.
    expect(Array.from(twoPieces.inputs.tokenIds)).toEqual([2, 6, 4, 3]);
    expect(twoPieces.numTruncatedWords).toBe(0);
    expect(twoPieces.inputs.numTruncated).toBe(1);
    expect(firstPiecePositions(twoPieces.wordIds)).toEqual([1, 2]);
    expect(() => prepareNer("Paris", tokenizer, tables, true, 2)).toThrow("sequenceLength must be an integer >= 3");
  });

  test("decoding reads first pieces and fills cut words with O", () => {
    const text = "Peter visits Paris .";
    const prepared = prepareNer(text, tokenizer, tables, true, 4); // "Paris" and "." cut
    const logits = Array.from({ length: 4 }, () => new Float64Array(labels.length));
    logits[1]![3] = 5; // peter: B-PER
    logits[2]![2] = 5; // visits: I-LOC (repaired to B-LOC)
    const entities = decodeNer(prepared, logits, labels, null, text);
    expect(entities.tags).toEqual(["B-PER", "B-LOC", "O", "O"]);
    expect(entities.numFilledWords).toBe(2);
    expect(entities.numRepairs).toBe(1);
    expect(describeSpans(entities.spans)).toEqual(['PER[0, 5) "Peter"', 'LOC[6, 12) "visits"']);
    expect(() => decodeNer(prepared, logits.slice(0, 2), labels, null, text)).toThrow(
      "logits must hold 5 scores for position 2 (got 2 positions)",
    );
  });
});
