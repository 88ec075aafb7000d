/**
 * Text <-> ids of a causal language model's tokenizer, and the text a generation streams:
 * the port of Python's `TextCodec` and `_TextStream` (`keras_attn/text_generation.py`) over
 * `CharacterTokenizer` (`keras_attn/text/character_tokenizer.py`) and `WordPieceTokenizer`.
 *
 * Three kinds, the card's `tokenizer`:
 *
 * - `"characters"` (`characters.json`, `{"kind": "characters", "symbols": [...]}`): one id
 *   per Unicode code point (not per UTF-16 unit); id 0 is `[PAD]`, id 1 `[UNK]` (any
 *   character the training text lacked; decoded as U+FFFD);
 * - `"bytes"` (`characters.json`, kind `"bytes"`): the UTF-8 bytes of the text, byte `b` is id
 *   `b + 1`; decoding replaces invalid UTF-8 with U+FFFD (Python's `errors="replace"`);
 * - `"wordpiece"` (`vocab.txt`): BERT word pieces without special tokens; decoding joins the
 *   pieces with spaces and glues `##` continuations (tf-text's `detokenize`); `[SEP]` ends a
 *   text (the stop token).
 */
import { ModelAssetError } from "./errors";
import { parseJson, asObject, field } from "./json";
import { TextTables } from "./textTables";
import { WordPieceTokenizer } from "./wordPieceTokenizer";

/** The character (or byte) vocabulary file of a character-level model. */
export const CHARACTERS_FILE = "characters.json";
/** The WordPiece vocabulary file. */
export const WORDPIECE_FILE = "vocab.txt";
/** What decoding gives for an `[UNK]` id and for the first bytes of an unfinished UTF-8 character. */
export const UNFINISHED = "\ufffd";

export type CodecKind = "characters" | "bytes" | "wordpiece";
const PAD_ID = 0;
const UNKNOWN_ID = 1;

/**
 * A language model's text <-> ids (Python `TextCodec`).
 *
 * Example:
 * ```ts
 * const codec = TextCodec.fromCharacters('{"kind": "characters", "symbols": ["[PAD]", "[UNK]", " ", "b", "e", "o", "t"]}');
 * codec.encode("be to");        // Int32Array [3, 4, 2, 6, 5]
 * codec.decode([6, 5]);         // "to"
 * codec.encode("bez");          // Int32Array [3, 4, 1]: "z" is [UNK]
 * ```
 */
export class TextCodec {
  /** The ids that end a text (`[SEP]` for WordPiece; none for characters and bytes). */
  readonly stopTokenIds: readonly number[];
  private readonly ids = new Map<number, number>();

  private constructor(
    readonly kind: CodecKind,
    /** The vocabulary, index = id (bytes: `[PAD]` then `<0x00>` ... `<0xFF>`). */
    readonly vocabulary: readonly string[],
    private readonly tokenizer: WordPieceTokenizer | null = null,
  ) {
    if (kind === "characters") {
      vocabulary.forEach((symbol, id) => {
        const points = Array.from(symbol);
        if (id > UNKNOWN_ID && points.length === 1) this.ids.set(symbol.codePointAt(0)!, id);
      });
    }
    this.stopTokenIds = tokenizer ? [tokenizer.sepId] : [];
  }

  /**
   * The codec of a `characters.json` (`{"kind", "symbols"}`, as `CharacterTokenizer.save`
   * writes it).
   *
   * @throws ModelAssetError for a file that is not one.
   */
  static fromCharacters(text: string, source = CHARACTERS_FILE): TextCodec {
    const root = asObject(parseJson(text, source), `${source}: the vocabulary`);
    const kind = field(root, "kind", source);
    const symbols = field(root, "symbols", source);
    if (!Array.isArray(symbols) || symbols.some((s) => typeof s !== "string")) {
      throw new ModelAssetError(`${source}: symbols must be a list of strings`);
    }
    if (kind === "bytes") {
      if (symbols.length !== 257) {
        throw new ModelAssetError(`${source}: a bytes vocabulary has 257 symbols ([PAD] and 256 bytes), got ${symbols.length}`);
      }
      return new TextCodec("bytes", symbols as string[]);
    }
    if (kind !== "characters") {
      throw new ModelAssetError(`${source}: kind must be "characters" or "bytes", got ${JSON.stringify(kind)}`);
    }
    if (symbols.length < 2) {
      throw new ModelAssetError(`${source}: a characters vocabulary starts with [PAD] and [UNK]`);
    }
    return new TextCodec("characters", symbols as string[]);
  }

  /** The codec of a WordPiece `vocab.txt` (one piece a line; `[SEP]` ends a text). */
  static fromWordPieces(text: string, lowercase: boolean, tables: TextTables = TextTables.load(),
    source = WORDPIECE_FILE): TextCodec {
    // Python reads it with str.splitlines().
    const vocabulary = text.split(/\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/);
    if (vocabulary[vocabulary.length - 1] === "") vocabulary.pop();
    let tokenizer: WordPieceTokenizer;
    try {
      tokenizer = new WordPieceTokenizer(vocabulary, lowercase, tables);
    } catch (error) {
      throw new ModelAssetError(`${source}: ${(error as Error).message}`);
    }
    return new TextCodec("wordpiece", vocabulary, tokenizer);
  }

  /** The number of ids. */
  get vocabularySize(): number {
    return this.vocabulary.length;
  }

  /** The ids of `text` (Python `TextCodec.encode`). */
  encode(text: string): Int32Array {
    if (this.kind === "wordpiece") return Int32Array.from(this.tokenizer!.tokenize(text).ids);
    if (this.kind === "bytes") return Int32Array.from(new TextEncoder().encode(text), (b) => b + 1);
    const ids: number[] = [];
    for (const c of text) ids.push(this.ids.get(c.codePointAt(0)!) ?? UNKNOWN_ID);
    return Int32Array.from(ids);
  }

  /**
   * The text of `ids` (Python `TextCodec.decode`): padding dropped, `[UNK]` as U+FFFD
   * (characters), invalid UTF-8 replaced (bytes).
   *
   * @throws RangeError on an id outside the vocabulary.
   */
  decode(ids: ArrayLike<number>): string {
    const pad = this.tokenizer ? this.tokenizer.padId : PAD_ID;
    const kept = Array.from(ids).filter((id) => id !== pad);
    for (const id of kept) {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabulary.length) {
        throw new RangeError(`token id ${id} is outside the vocabulary (size ${this.vocabulary.length})`);
      }
    }
    if (this.kind === "bytes") {
      return new TextDecoder("utf-8", { fatal: false, ignoreBOM: true }).decode(Uint8Array.from(kept, (id) => id - 1));
    }
    if (this.kind === "characters") {
      return kept.map((id) => (id === UNKNOWN_ID ? UNFINISHED : this.vocabulary[id]!)).join("");
    }
    // tf-text's WordPiece detokenize: pieces joined by spaces, `##` continuations glued
    // (a leading continuation keeps its `##`).
    let text = "";
    kept.forEach((id, i) => {
      const token = this.vocabulary[id]!;
      if (i === 0) text = token;
      else text += token.startsWith("##") ? token.slice(2) : " " + token;
    });
    return text;
  }
}

/**
 * The text of a generation as it grows, one token at a time (Python `_TextStream`): `add`
 * returns what the new token added to the decoded text, `""` while a character is cut inside
 * its UTF-8 bytes (or an `[UNK]` ends the text: both decode to a trailing U+FFFD, held back
 * until the next token), `finish` the rest. The pieces add up to the decoded text.
 *
 * Example (bytes: "é" is two tokens):
 * ```ts
 * const stream = new TextStream(codec);
 * stream.add(0xc3 + 1);   // ""
 * stream.add(0xa9 + 1);   // "é"
 * stream.finish();        // ""
 * ```
 */
export class TextStream {
  /** The ids added (stop tokens skipped). */
  readonly ids: number[] = [];
  /** The text handed out so far. */
  text = "";

  constructor(private readonly codec: TextCodec) {}

  /** Adds `token`; the text it adds (`""` for none: a stop token, an unfinished character). */
  add(token: number): string {
    if (this.codec.stopTokenIds.includes(token)) return "";
    this.ids.push(token);
    return this.emit(this.codec.decode(this.ids), false);
  }

  /** The rest of the text: what was held back (a trailing U+FFFD). */
  finish(): string {
    return this.emit(this.codec.decode(this.ids), true);
  }

  private emit(text: string, final: boolean): string {
    if (!final && text.endsWith(UNFINISHED)) return "";
    if (text.startsWith(this.text) && text.length > this.text.length) {
      const piece = text.slice(this.text.length);
      this.text = text;
      return piece;
    }
    return "";
  }
}
