import { codePointsOf } from "./codePoints";
import { ModelAssetError } from "./errors";
import { CharClass, TextTables } from "./textTables";

/** Word pieces of a text: ids and `[start, end)` code-point offsets into the text. */
export interface Pieces {
  readonly ids: Int32Array;
  readonly starts: Int32Array;
  readonly ends: Int32Array;
}

/** Fixed-length model inputs of one text (batch of one), as the `.tflite` inputs take them. */
export interface ModelInputs {
  /** `[CLS] pieces [SEP]` then padding, `sequenceLength` ids. */
  readonly tokenIds: Int32Array;
  /** All zeros (one segment). */
  readonly segmentIds: Int32Array;
  /** 1 for real tokens, 0 for padding. */
  readonly paddingMask: Int32Array;
  /** Number of real tokens (`[CLS]` and `[SEP]` included). */
  readonly length: number;
  /** Word pieces cut to fit the sequence length. */
  readonly numTruncated: number;
}

/** Special tokens and the word limit of a {@link WordPieceTokenizer}. */
export interface WordPieceOptions {
  /**
   * The word limit in characters (code points) of the normalized word, HF's
   * `max_input_chars_per_word` (default 100): a longer word is one `[UNK]`.
   */
  maxWordCharacters?: number;
  unknownToken?: string;
  clsToken?: string;
  sepToken?: string;
  padToken?: string;
}

/** Growing `Pieces` of one text. */
interface PieceLists {
  ids: number[];
  starts: number[];
  ends: number[];
}

/**
 * BERT WordPiece tokenizer: HF `tokenizers`' `BertNormalizer` + `BertPreTokenizer` +
 * `WordPiece` (what BERT and MiniLM were pretrained with), as keras-attn's Python
 * `WordPieceTokenizer` implements them (`keras_attn/text/tokenizer.py`), via the Kotlin core;
 * ids and offsets equal the Python ones (checked on every golden vector).
 *
 * Steps, per the reference:
 * 1. normalization, code point by code point ({@link TextTables.normalize}): control and
 *    private-use characters are removed, whitespace becomes a space; uncased models also
 *    lower-case (Unicode lower-casing, not case folding: "ß" stays "ß"), NFD-decompose and
 *    drop nonspacing marks ("é" -> "e", "a\u0301" -> "a"; "´" and "…" stay, no
 *    compatibility mapping);
 * 2. pre-tokenization of the normalized text ({@link TextTables.tokenizerClass}):
 *    whitespace separates words, each punctuation character and CJK ideograph is a word;
 * 3. a word of more than `maxWordCharacters` characters becomes `[UNK]`; any other is split
 *    greedily into the longest vocabulary pieces from the left, continuations prefixed with
 *    `##`; a word with no complete spelling becomes one `[UNK]`.
 *
 * Offsets are code points of the original text (Python `str` indices, not UTF-16 units), as
 * HF reports them: each normalized character comes from one original character and spans
 * it; a piece spans from the character of its first normalized character to the end of the
 * character of its last. So characters removed by normalization (combining accents,
 * zero-width and control characters) belong to no piece ("e\u0301" -> "e" at [0, 1)), and
 * every piece made from one character ("한" -> three jamo pieces) spans that whole character.
 *
 * Example:
 * ```ts
 * const tokenizer = new WordPieceTokenizer(
 *   ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "##s"], true, TextTables.load());
 * tokenizer.tokenize("The cats").ids;  // Int32Array [4, 5, 6]
 * ```
 */
export class WordPieceTokenizer {
  readonly vocabularySize: number;
  readonly maxWordCharacters: number;
  readonly unknownId: number;
  readonly clsId: number;
  readonly sepId: number;
  readonly padId: number;
  private readonly tokenToId = new Map<string, number>();
  /** The longest token in code points, without its `##`. */
  private readonly maxTokenLength: number;

  /**
   * @param vocabulary the tokens, index = id (`vocab.txt`).
   * @param lowercase uncased normalization (the card's `tokenizer.lowercase`; accents are
   *     stripped exactly when lower-casing, as in every keras-attn export).
   * @param tables the normalization and class tables.
   * @param options the word limit and the special tokens (BERT's by default).
   * @throws RangeError when `maxWordCharacters` is not an integer >= 1.
   * @throws ModelAssetError on an empty or repeated token, or a missing special token.
   */
  constructor(
    vocabulary: readonly string[],
    readonly lowercase: boolean,
    private readonly tables: TextTables,
    options: WordPieceOptions = {},
  ) {
    this.maxWordCharacters = options.maxWordCharacters ?? 100;
    if (!Number.isInteger(this.maxWordCharacters) || this.maxWordCharacters < 1) {
      throw new RangeError(`maxWordCharacters must be an integer >= 1, got ${this.maxWordCharacters}`);
    }
    this.vocabularySize = vocabulary.length;
    this.maxTokenLength = this.indexVocabulary(vocabulary);
    this.unknownId = this.special(options.unknownToken ?? "[UNK]", "unknown");
    this.clsId = this.special(options.clsToken ?? "[CLS]", "cls");
    this.sepId = this.special(options.sepToken ?? "[SEP]", "sep");
    this.padId = this.special(options.padToken ?? "[PAD]", "pad");
  }

  /** The id of `token`, or `undefined`. */
  idOf(token: string): number | undefined {
    return this.tokenToId.get(token);
  }

  /**
   * Word pieces of a text with code-point offsets (`tokenize_with_offsets` in Python).
   *
   * @param text any string; lone surrogates are treated as removed characters.
   * @returns ids and offsets of every piece (no special tokens, no truncation).
   */
  tokenize(text: string): Pieces {
    const codePoints = codePointsOf(text);
    // Normalized characters and, for each, the index of the character it came from.
    const normalized: number[] = [];
    const source: number[] = [];
    for (let i = 0; i < codePoints.length; i++) {
      for (const c of this.tables.normalize(codePoints[i]!, this.lowercase)) {
        normalized.push(c);
        source.push(i);
      }
    }
    const out: PieceLists = { ids: [], starts: [], ends: [] };
    let position = 0;
    while (position < normalized.length) {
      const kind = this.tables.tokenizerClass(normalized[position]!);
      if (kind === CharClass.WHITESPACE) {
        position += 1;
        continue;
      }
      let end = position + 1;
      if (kind !== CharClass.SINGLE) {
        while (end < normalized.length && this.tables.tokenizerClass(normalized[end]!) === CharClass.WORD) end += 1;
      }
      this.addWord(normalized, source, position, end, out);
      position = end;
    }
    return { ids: Int32Array.from(out.ids), starts: Int32Array.from(out.starts), ends: Int32Array.from(out.ends) };
  }

  /**
   * Word-piece ids of pre-split words, each tokenized as a text of its own (Python
   * `tokenize_words`); a word can yield several pieces or none.
   */
  tokenizeWords(words: readonly string[]): Int32Array[] {
    return words.map((word) => this.tokenize(word).ids);
  }

  /**
   * `[CLS] pieces [SEP]` padded to `sequenceLength`; pieces beyond `sequenceLength - 2` are
   * cut and counted (Python's packer truncates the same way).
   */
  pack(pieceIds: ArrayLike<number>, sequenceLength: number): ModelInputs {
    if (!Number.isInteger(sequenceLength) || sequenceLength < 2) {
      throw new RangeError(`sequenceLength must be an integer >= 2 ([CLS] and [SEP]), got ${sequenceLength}`);
    }
    const kept = Math.min(pieceIds.length, sequenceLength - 2);
    const tokenIds = new Int32Array(sequenceLength).fill(this.padId);
    const paddingMask = new Int32Array(sequenceLength);
    tokenIds[0] = this.clsId;
    for (let i = 0; i < kept; i++) tokenIds[i + 1] = pieceIds[i]!;
    tokenIds[kept + 1] = this.sepId;
    paddingMask.fill(1, 0, kept + 2);
    return {
      tokenIds,
      segmentIds: new Int32Array(sequenceLength),
      paddingMask,
      length: kept + 2,
      numTruncated: pieceIds.length - kept,
    };
  }

  /** Packed classifier inputs of a text: `pack(tokenize(text).ids, sequenceLength)`. */
  encode(text: string, sequenceLength: number): ModelInputs {
    return this.pack(this.tokenize(text).ids, sequenceLength);
  }

  /** Fills `tokenToId`; returns the longest token length in code points, `##` not counted. */
  private indexVocabulary(vocabulary: readonly string[]): number {
    let longest = 1;
    for (const [id, token] of vocabulary.entries()) {
      if (token.length === 0) {
        throw new ModelAssetError(`vocabulary line ${id + 1} is empty: every line of vocab.txt must hold a token`);
      }
      const previous = this.tokenToId.get(token);
      if (previous !== undefined) {
        throw new ModelAssetError(`vocabulary line ${id + 1}: token "${token}" repeats line ${previous + 1}`);
      }
      this.tokenToId.set(token, id);
      const length = codePointsOf(token).length - (token.startsWith("##") ? 2 : 0);
      if (length > longest) longest = length;
    }
    return longest;
  }

  private special(token: string, name: string): number {
    const id = this.tokenToId.get(token);
    if (id === undefined) {
      throw new ModelAssetError(
        `the vocabulary has no ${name} token "${token}" (vocab.txt must be the model's BERT vocabulary)`,
      );
    }
    return id;
  }

  /**
   * The pieces of the word `normalized[begin, end)`, appended to `out`; `source[q]` is the
   * original character of `normalized[q]`.
   */
  private addWord(
    normalized: readonly number[],
    source: readonly number[],
    begin: number,
    end: number,
    out: PieceLists,
  ): void {
    const firstPiece = out.ids.length;
    for (let position = begin; position < end && end - begin <= this.maxWordCharacters; ) {
      const [id, stop] = this.longestPiece(normalized, position, end, position > begin);
      if (id < 0) break;
      out.ids.push(id);
      out.starts.push(source[position]!);
      out.ends.push(source[stop - 1]! + 1);
      position = stop;
      if (position === end) return;
    }
    // Too long, or no spelling of the whole word: it is one unknown token.
    for (const list of [out.ids, out.starts, out.ends]) list.length = firstPiece;
    out.ids.push(this.unknownId);
    out.starts.push(source[begin]!);
    out.ends.push(source[end - 1]! + 1);
  }

  /** `[id, stop]` of the longest vocabulary piece `normalized[position, stop)`, or `[-1, position]`. */
  private longestPiece(
    normalized: readonly number[],
    position: number,
    end: number,
    continuation: boolean,
  ): [number, number] {
    for (let stop = Math.min(end, position + this.maxTokenLength); stop > position; stop--) {
      const piece = (continuation ? "##" : "") + String.fromCodePoint(...normalized.slice(position, stop));
      const id = this.tokenToId.get(piece);
      if (id !== undefined) return [id, stop];
    }
    return [-1, position];
  }
}
