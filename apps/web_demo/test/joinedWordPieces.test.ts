/**
 * Joined word pieces (src/lib/core/joinedWordPieces.ts) on a hand-made vocabulary: the
 * pieces and joiners Python's `JoinedWordPieces` gives over this vocabulary (printed by
 * keras_attn at 2026-11-29: its doctest, and the spaces of Python's `str.isspace`, which are
 * not JavaScript's `\s`), and the detokenized text.
 */
import { describe, expect, test } from "vitest";

import { JoinedWordPieces, TextTables, WordPieceTokenizer } from "../src/lib/core";
import { isPythonSpace } from "../src/lib/core/joinedWordPieces";

// prettier-ignore
const vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[JOIN]", "a", "bike", ".", "man", "'",
  "s", "T", "-", "shirt", "##s", "A"];
const pieces = new JoinedWordPieces(new WordPieceTokenizer(vocabulary, false, TextTables.load()), vocabulary);
const tokens = (text: string) => Array.from(pieces.encode(text), (id) => vocabulary[id]);

describe("JoinedWordPieces", () => {
  test("Python's doctest: a joiner before a piece that touches the one before", () => {
    expect(Array.from(pieces.encode("a bike."))).toEqual([6, 7, 5, 8]);
    expect(pieces.decode([6, 7, 5, 8])).toBe("a bike.");
  });

  test("punctuation inside words, continuations without joiners", () => {
    expect(tokens("A man's T-shirt.")).toEqual(
      ["A", "man", "[JOIN]", "'", "[JOIN]", "s", "T", "[JOIN]", "-", "[JOIN]", "shirt", "[JOIN]", "."]);
    expect(tokens("bikes.")).toEqual(["bike", "##s", "[JOIN]", "."]);
    expect(pieces.decode(pieces.encode("A man's T-shirt."))).toBe("A man's T-shirt.");
  });

  test("whitespace is Python's str.isspace, not JavaScript's \\s", () => {
    // Python's answers (JoinedWordPieces over this vocabulary). \x1c and \x85 are spaces to
    // Python, not to \s; U+FEFF is one to \s, not to Python (all removed by the normalizer).
    expect(tokens("a\x1c.")).toEqual(["a", "."]);
    expect(tokens("a\x85.")).toEqual(["a", "."]);
    expect(tokens("a\u3000.")).toEqual(["a", "."]);
    expect(tokens("a\ufeff.")).toEqual(["a", "[JOIN]", "."]);
    expect(tokens("a\u200b.")).toEqual(["a", "[JOIN]", "."]);
    expect(tokens("a \u200bbike")).toEqual(["a", "[JOIN]", "bike"]);
    expect(tokens("a\u2028bike")).toEqual(["a", "bike"]);
    expect([0x1c, 0x85, 0x3000].every(isPythonSpace)).toBe(true);
    expect([0xfeff, 0x200b, 0x180e].some(isPythonSpace)).toBe(false);
  });

  test("the first piece never gets a joiner, even after removed characters", () => {
    expect(tokens("\u200b.a")).toEqual([".", "[JOIN]", "a"]);
    expect(tokens(" .")).toEqual(["."]);
  });

  test("decode skips padding, glues continuations and keeps other specials as words", () => {
    expect(pieces.decode([0, 6, 0, 7, 15, 5, 8, 0])).toBe("a bikes.");
    expect(pieces.decode([15, 6, 1, 5, 5, 8])).toBe("s a [UNK].");
    expect(pieces.decode([])).toBe("");
    expect(() => pieces.decode([17])).toThrow("token id 17 is outside the vocabulary (size 17)");
  });

  test("a vocabulary without the joiner is refused", () => {
    const plain = vocabulary.filter((t) => t !== "[JOIN]");
    expect(() => new JoinedWordPieces(new WordPieceTokenizer(plain, false, TextTables.load()), plain))
      .toThrow('the vocabulary has no joiner token "[JOIN]"');
  });
});
