/** WordPiece, normalization, offsets and packing on a hand-made vocabulary (Kotlin `TokenizerTest`). */
import { describe, expect, test } from "vitest";

import { ModelAssetError, type Pieces, TextTables, WordPieceTokenizer, sliceCodePoints, toUtf16Index } from "../src/lib/core";

const tables = TextTables.load();
// prettier-ignore
const vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "unaff", "the", "cat",
  "##s", "hello", "h", "##ello", "ss", "st", "##ras", "##se", "北", "京", ",", "a", "##a", "cafe", "é"];

const tokenizer = (lowercase: boolean, maxWordBytes = 100) =>
  new WordPieceTokenizer(vocabulary, lowercase, tables, { maxWordBytes });
const tokens = (pieces: Pieces) => Array.from(pieces.ids, (id) => vocabulary[id]);

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

  test("words longer than the byte limit are unknown", () => {
    expect(tokenizer(true).tokenize("a".repeat(100)).ids.length).toBe(100); // a ##a ##a ...
    expect(tokens(tokenizer(true).tokenize("a".repeat(101)))).toEqual(["[UNK]"]);
    // The limit counts UTF-8 bytes after normalization: "é" is 2 bytes cased, 1 uncased.
    expect(tokens(tokenizer(false, 3).tokenize("éé"))).toEqual(["[UNK]"]);
    expect(tokens(tokenizer(true, 3).tokenize("áÁ"))).toEqual(["a", "##a"]);
  });

  test("uncased folds case and strips accents, cased keeps them", () => {
    expect(tokens(tokenizer(true).tokenize("HÉLLO"))).toEqual(["hello"]);
    expect(tokens(tokenizer(true).tokenize("Cafe\u0301"))).toEqual(["cafe"]);
    expect(tokens(tokenizer(false).tokenize("Hello"))).toEqual(["[UNK]"]);
    expect(tokens(tokenizer(false).tokenize("é"))).toEqual(["é"]);
    // Full case folding: ß -> ss, and the offsets of the pieces inside the expansion.
    const pieces = tokenizer(true).tokenize("Straße");
    expect(tokens(pieces)).toEqual(["st", "##ras", "##se"]);
    expect(Array.from(pieces.starts)).toEqual([0, 2, 4]);
    expect(Array.from(pieces.ends)).toEqual([2, 4, 6]);
  });

  test("CJK ideographs and punctuation are words of their own", () => {
    const pieces = tokenizer(true).tokenize("北京,cat");
    expect(tokens(pieces)).toEqual(["北", "京", ",", "cat"]);
    expect(Array.from(pieces.starts)).toEqual([0, 1, 2, 3]);
  });

  test("offsets count code points; removed characters stay with the piece before", () => {
    // U+1F600 is two UTF-16 units but one code point; U+200B is removed (uncased).
    const text = "\u{1F600} the\u200B cat";
    const pieces = tokenizer(true).tokenize(text);
    expect(tokens(pieces)).toEqual(["[UNK]", "the", "cat"]);
    expect(Array.from(pieces.starts)).toEqual([0, 2, 7]);
    expect(Array.from(pieces.ends)).toEqual([1, 6, 10]);
    expect(sliceCodePoints(text, 2, 6)).toBe("the\u200B");
    expect(toUtf16Index("\u{1F600} the", 2)).toBe(3);
  });

  test("control characters separate words and lone surrogates vanish", () => {
    expect(tokens(tokenizer(false).tokenize("the\u0007cat"))).toEqual(["the", "cat"]);
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
