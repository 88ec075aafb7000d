/**
 * WordPiece, normalization, offsets and packing on a hand-made vocabulary (Kotlin
 * `TokenizerTest`). Every expected piece and offset is HF `tokenizers`' answer
 * (`BertWordPieceTokenizer` over this vocabulary, tokenizers 0.22.2).
 */
import { describe, expect, test } from "vitest";

import { ModelAssetError, type Pieces, TextTables, WordPieceTokenizer, sliceCodePoints, toUtf16Index } from "../src/lib/core";

const tables = TextTables.load();
// prettier-ignore
const vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "unaff", "the", "cat",
  "##s", "hello", "h", "##ello", "ss", "st", "##ras", "##se", "北", "京", ",", "a", "##a", "cafe", "é",
  "…", ".", "he", "##i", "##ße", "ij", "##´", "##b", "ω", "##ω", "e", "ab", "ᄒ", "##ᅡ", "##ᆫ", "##raße"];

const tokenizer = (lowercase: boolean, maxWordCharacters = 100) =>
  new WordPieceTokenizer(vocabulary, lowercase, tables, { maxWordCharacters });
const tokens = (pieces: Pieces) => Array.from(pieces.ids, (id) => vocabulary[id]);
/** `[token, start, end]` of every piece. */
const spans = (pieces: Pieces) => Array.from(pieces.ids, (id, i) => [vocabulary[id], pieces.starts[i], pieces.ends[i]]);

describe("WordPieceTokenizer", () => {
  test("word pieces take the longest match from the left", () => {
    // "unaff" beats "un"; what remains must be spelled with ## continuations.
    expect(tokens(tokenizer(true).tokenize("unaffable"))).toEqual(["unaff", "##able"]);
    expect(tokens(tokenizer(true).tokenize("the cats"))).toEqual(["the", "cat", "##s"]);
  });

  test("a word without a complete spelling is one unknown token", () => {
    const pieces = tokenizer(true).tokenize("the catz cat");
    expect(tokens(pieces)).toEqual(["the", "[UNK]", "cat"]);
    expect(Array.from(pieces.starts)).toEqual([0, 4, 9]);
    expect(Array.from(pieces.ends)).toEqual([3, 8, 12]);
  });

  test("words of more than 100 characters are unknown", () => {
    expect(tokenizer(true).tokenize("a".repeat(100)).ids.length).toBe(100); // a ##a ##a ...
    expect(spans(tokenizer(true).tokenize("a".repeat(101)))).toEqual([["[UNK]", 0, 101]]);
    // The limit counts characters, not UTF-8 bytes: 51 "ω" are 102 bytes but 51 pieces.
    for (const lowercase of [true, false]) {
      const pieces = tokenizer(lowercase).tokenize("ω".repeat(51));
      expect(tokens(pieces)).toEqual(["ω", ...Array<string>(50).fill("##ω")]);
      expect(Array.from(pieces.ends)).toEqual(Array.from({ length: 51 }, (_, i) => i + 1));
      expect(spans(tokenizer(lowercase).tokenize("ω".repeat(101)))).toEqual([["[UNK]", 0, 101]]);
    }
    expect(tokens(tokenizer(false, 2).tokenize("ωω"))).toEqual(["ω", "##ω"]);
    expect(spans(tokenizer(false, 1).tokenize("ωω"))).toEqual([["[UNK]", 0, 2]]);
    expect(() => tokenizer(false, 0)).toThrow("maxWordCharacters must be an integer >= 1, got 0");
  });

  test("uncased lower-cases and strips accents, cased keeps them", () => {
    expect(tokens(tokenizer(true).tokenize("HÉLLO"))).toEqual(["hello"]);
    expect(tokens(tokenizer(true).tokenize("Cafe\u0301"))).toEqual(["cafe"]);
    expect(tokens(tokenizer(false).tokenize("Hello"))).toEqual(["[UNK]"]);
    expect(tokens(tokenizer(false).tokenize("é"))).toEqual(["é"]);
    expect(spans(tokenizer(false).tokenize("Cafe\u0301"))).toEqual([["[UNK]", 0, 5]]);
  });

  test("no compatibility mapping or case folding (issue 50's hard cases)", () => {
    for (const lowercase of [true, false]) {
      const t = tokenizer(lowercase);
      expect(spans(t.tokenize("…"))).toEqual([["…", 0, 1]]); // not three "."
      expect(spans(t.tokenize("heiße"))).toEqual([["he", 0, 2], ["##i", 2, 3], ["##ße", 3, 5]]); // not "ss"
      expect(spans(t.tokenize("ĳ"))).toEqual([["[UNK]", 0, 1]]); // not "ij"
      expect(spans(t.tokenize("a´b"))).toEqual([["a", 0, 1], ["##´", 1, 2], ["##b", 2, 3]]); // "´" kept
      expect(spans(t.tokenize("\u00ad…\u00ad"))).toEqual([["…", 1, 2]]); // soft hyphens removed
    }
    expect(spans(tokenizer(true).tokenize("Straße"))).toEqual([["st", 0, 2], ["##raße", 2, 6]]);
  });

  test("characters removed by normalization belong to no piece", () => {
    expect(spans(tokenizer(true).tokenize("e\u0301"))).toEqual([["e", 0, 1]]);
    expect(spans(tokenizer(false).tokenize("e\u0301"))).toEqual([["[UNK]", 0, 2]]); // the accent is kept cased
    expect(spans(tokenizer(true).tokenize("a\u0301b\u0301"))).toEqual([["ab", 0, 3]]);
    expect(spans(tokenizer(false).tokenize("ab\u200b"))).toEqual([["ab", 0, 2]]);
  });

  test("pieces made from one character span that character", () => {
    // "한" -> the jamo ᄒ ᅡ ᆫ (uncased NFD): three pieces, each [0, 1).
    expect(spans(tokenizer(true).tokenize("한"))).toEqual([["ᄒ", 0, 1], ["##ᅡ", 0, 1], ["##ᆫ", 0, 1]]);
    expect(spans(tokenizer(false).tokenize("한"))).toEqual([["[UNK]", 0, 1]]);
  });

  test("CJK ideographs and punctuation are words of their own", () => {
    const pieces = tokenizer(true).tokenize("北京,cat");
    expect(spans(pieces)).toEqual([["北", 0, 1], ["京", 1, 2], [",", 2, 3], ["cat", 3, 6]]);
  });

  test("offsets count code points", () => {
    // U+1F600 is two UTF-16 units but one code point; U+200B is removed and in no piece.
    const text = "\u{1F600} the\u200B cat";
    for (const lowercase of [true, false]) {
      expect(spans(tokenizer(lowercase).tokenize(text))).toEqual([["[UNK]", 0, 1], ["the", 2, 5], ["cat", 7, 10]]);
    }
    expect(sliceCodePoints(text, 2, 5)).toBe("the");
    expect(toUtf16Index("\u{1F600} the", 2)).toBe(3);
  });

  test("control characters and lone surrogates are removed", () => {
    // Removed, not a space: "the\u0007cat" is the one word "thecat" (no spelling here).
    expect(spans(tokenizer(false).tokenize("the\u0007cat"))).toEqual([["[UNK]", 0, 7]]);
    expect(tokens(tokenizer(false).tokenize("cat\uD800s"))).toEqual(["cat", "##s"]);
    // A lone surrogate still counts as a code point of the text.
    expect(Array.from(tokenizer(false).tokenize("\uDC00cat").starts)).toEqual([1]);
  });

  test("packing adds specials, pads and counts truncation", () => {
    const t = tokenizer(true);
    const short = t.encode("the cat", 6);
    expect(Array.from(short.tokenIds)).toEqual([2, 9, 10, 3, 0, 0]);
    expect(Array.from(short.paddingMask)).toEqual([1, 1, 1, 1, 0, 0]);
    expect(Array.from(short.segmentIds)).toEqual([0, 0, 0, 0, 0, 0]);
    expect(short.numTruncated).toBe(0);
    const long = t.encode("the cats the cat", 4);
    expect(Array.from(long.tokenIds)).toEqual([2, 9, 10, 3]);
    expect(long.numTruncated).toBe(3);
    expect(long.length).toBe(4);
    expect(Array.from(t.encode("", 3).tokenIds)).toEqual([2, 3, 0]);
    expect(() => t.encode("the", 1)).toThrow("sequenceLength must be an integer >= 2");
  });

  test("vocabulary errors name the line", () => {
    const repeated = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "the"];
    expect(() => new WordPieceTokenizer(repeated, true, tables)).toThrow(
      new ModelAssetError('vocabulary line 6: token "the" repeats line 5'),
    );
    expect(() => new WordPieceTokenizer(["[PAD]", "[CLS]", "[SEP]"], true, tables)).toThrow('no unknown token "[UNK]"');
    expect(() => new WordPieceTokenizer(["[PAD]", ""], true, tables)).toThrow("vocabulary line 2 is empty");
    expect(() => new WordPieceTokenizer(["[PAD]", ""], true, tables)).toThrow(ModelAssetError);
  });

  test("idOf looks tokens up", () => {
    expect(tokenizer(true).idOf("##ras")).toBe(17);
    expect(tokenizer(true).idOf("dog")).toBeUndefined();
  });
});
