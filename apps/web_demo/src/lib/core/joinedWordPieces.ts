import { codePointsOf } from "./codePoints";
import { ModelAssetError } from "./errors";
import type { WordPieceTokenizer } from "./wordPieceTokenizer";

/** The joiner token of keras-attn's seq2seq vocabularies. */
export const JOINER_TOKEN = "[JOIN]";

/**
 * Python's `str.isspace()`: the code points with Unicode bidirectional class WS, B or S, or
 * general category Zs (`[c for c in range(0x110000) if chr(c).isspace()]`).
 */
const PYTHON_SPACES = new Set([
  0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001,
  0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029,
  0x202f, 0x205f, 0x3000,
]);

/** True for the code points Python's `str.isspace()` accepts. */
export function isPythonSpace(codePoint: number): boolean {
  return PYTHON_SPACES.has(codePoint);
}

/**
 * Reversible word pieces for generated text: BERT word pieces plus a `[JOIN]` token before
 * every word that touched the previous one in the text, as Python's `JoinedWordPieces`
 * (`keras_attn/text/joined_word_pieces.py`; OpenNMT's joiner annotation):
 *
 *     "A man's T-shirt."  ->  A man [JOIN] ' [JOIN] s T [JOIN] - [JOIN] shirt [JOIN] .
 *
 * `decode` glues a word that follows `[JOIN]` (and every `##` continuation) to the text
 * before it and puts one space before every other word, so the round trip gives the text
 * back with each run of whitespace as one space (when no character is dropped or `[UNK]`).
 *
 * Example:
 * ```ts
 * const vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[JOIN]", "a", "bike", "."];
 * const pieces = new JoinedWordPieces(new WordPieceTokenizer(vocabulary, false, TextTables.load()), vocabulary);
 * pieces.encode("a bike.");        // Int32Array [6, 7, 5, 8]
 * pieces.decode([6, 7, 5, 8]);     // "a bike."
 * ```
 */
export class JoinedWordPieces {
  readonly joinerId: number;
  private readonly continuation: boolean[];

  /**
   * @param tokenizer the word-piece tokenizer of `vocabulary`.
   * @param vocabulary the tokens, index = id (`vocab.txt`).
   * @param joinerToken the joiner (the card's `joiner_token`).
   * @throws ModelAssetError when the vocabulary has no joiner or is not the tokenizer's.
   */
  constructor(
    readonly tokenizer: WordPieceTokenizer,
    readonly vocabulary: readonly string[],
    readonly joinerToken: string = JOINER_TOKEN,
  ) {
    if (vocabulary.length !== tokenizer.vocabularySize) {
      throw new ModelAssetError(
        `the vocabulary has ${vocabulary.length} tokens, the tokenizer ${tokenizer.vocabularySize}: ` +
          "pass the tokenizer's own vocabulary");
    }
    const joiner = tokenizer.idOf(joinerToken);
    if (joiner === undefined) {
      throw new ModelAssetError(
        `the vocabulary has no joiner token "${joinerToken}": it is not a seq2seq vocabulary ` +
          "of keras-attn (export the translation run again)");
    }
    this.joinerId = joiner;
    this.continuation = vocabulary.map((token) => token.startsWith("##"));
  }

  /** The piece ids of `text`, a joiner before each piece that touches the one before it. */
  encode(text: string): Int32Array {
    const codePoints = codePointsOf(text);
    const { ids, starts } = this.tokenizer.tokenize(text);
    const joined: number[] = [];
    for (let position = 0; position < ids.length; position++) {
      const piece = ids[position]!;
      const start = starts[position]!;
      const touches = position > 0 && start > 0 && !isPythonSpace(codePoints[start - 1]!);
      if (touches && !this.continuation[piece]) joined.push(this.joinerId);
      joined.push(piece);
    }
    return Int32Array.from(joined);
  }

  /**
   * The text of piece ids: joiners and `##` continuations glued, padding skipped.
   *
   * @throws RangeError on an id outside the vocabulary.
   */
  decode(ids: Iterable<number>): string {
    let text = "";
    let glue = true;
    for (const piece of ids) {
      if (piece === this.tokenizer.padId) continue;
      if (piece === this.joinerId) {
        glue = true;
        continue;
      }
      const token = this.vocabulary[piece];
      if (token === undefined || !Number.isInteger(piece)) {
        throw new RangeError(`token id ${piece} is outside the vocabulary (size ${this.vocabulary.length})`);
      }
      if (this.continuation[piece]) text += token.slice(2);
      else text += glue ? token : " " + token;
      glue = false;
    }
    return text;
  }
}
