import { codePointsOf, sliceCodePoints, stringOfCodePoints } from "./codePoints";
import type { CrfTransitions, Precision } from "./crf";
import { argmax } from "./scores";
import { CharClass, type TextTables } from "./textTables";
import type { ModelInputs, WordPieceTokenizer } from "./wordPieceTokenizer";

/** One word of a raw text: its kept characters and its `[start, end)` code-point span. */
export interface Word {
  readonly text: string;
  readonly start: number;
  readonly end: number;
}

/** An entity over words `[startWord, endWord)`, characters `[startChar, endChar)` (code points). */
export interface EntitySpan {
  readonly type: string;
  readonly startWord: number;
  readonly endWord: number;
  readonly startChar: number;
  readonly endChar: number;
  /** The text's code points `[startChar, endChar)`. */
  readonly text: string;
}

/** Tagger inputs of one text, and the word of each position. */
export interface TaggerInputs {
  readonly words: readonly Word[];
  readonly inputs: ModelInputs;
  /** Word index of each position, -1 for `[CLS]`, `[SEP]` and padding. */
  readonly wordIds: Int32Array;
  /** Words whose first piece fell beyond the sequence length. */
  readonly numTruncatedWords: number;
}

/** The tagger's reading of one text: a repaired IOB2 tag per word and the entity spans. */
export interface Entities {
  readonly words: readonly Word[];
  readonly tags: readonly string[];
  readonly spans: readonly EntitySpan[];
  /** Words tagged "O" because they had no piece (cut by the sequence length, or empty). */
  readonly numFilledWords: number;
  /** Tags changed by the IOB2 repair. */
  readonly numRepairs: number;
}

/**
 * Words of a text by BERT's basic tokenization (whitespace, punctuation and CJK ideographs;
 * control and format characters removed), offsets in code points: the port of
 * `keras_attn.text.word_splitter.split_words`.
 *
 * Example:
 * ```ts
 * splitWords("Hi, J.R.", TextTables.load(), false).map((w) => w.text);  // ["Hi", ",", "J", ".", "R", "."]
 * ```
 *
 * @param stripAccents the tokenizer's `strip_accents` (BERT uncased also removes `Mn`).
 */
export function splitWords(text: string, tables: TextTables, stripAccents: boolean): Word[] {
  const codePoints = codePointsOf(text);
  const words: Word[] = [];
  let current: number[] | null = null;
  let start = 0;
  let end = 0;
  for (let position = 0; position < codePoints.length; position++) {
    const c = codePoints[position]!;
    const kind = tables.wordClass(c, stripAccents);
    if (kind === CharClass.REMOVED) continue;
    if (kind === CharClass.WHITESPACE || kind === CharClass.SINGLE) {
      if (current !== null) words.push({ text: stringOfCodePoints(current), start, end });
      current = null;
      if (kind === CharClass.SINGLE) words.push({ text: String.fromCodePoint(c), start: position, end: position + 1 });
      continue;
    }
    if (current === null) {
      current = [];
      start = position;
    }
    current.push(c);
    end = position + 1;
  }
  if (current !== null) words.push({ text: stringOfCodePoints(current), start, end });
  return words;
}

/**
 * Words, `[CLS] pieces [SEP]` cut to `sequenceLength` and padded, and the word of each
 * position (`entity_prediction.ner_model_inputs`, `ner.align_word_labels`): a word whose first
 * piece does not fit is counted in `numTruncatedWords`; a word cut after its first piece keeps
 * its tag.
 *
 * Example:
 * ```ts
 * const prepared = prepareNer("Peter visits Paris", tokenizer, tables, card.stripAccents, card.sequenceLength);
 * // run the model on prepared.inputs, then decodeNer(prepared, logits, card.labels, card.crf, text)
 * ```
 */
export function prepareNer(
  text: string,
  tokenizer: WordPieceTokenizer,
  tables: TextTables,
  stripAccents: boolean,
  sequenceLength: number,
): TaggerInputs {
  if (!Number.isInteger(sequenceLength) || sequenceLength < 3) {
    throw new RangeError(`sequenceLength must be an integer >= 3 ([CLS], a piece, [SEP]), got ${sequenceLength}`);
  }
  const words = splitWords(text, tables, stripAccents);
  const body = sequenceLength - 2;
  const pieces: number[] = [];
  const pieceWords: number[] = [];
  let numTruncatedWords = 0;
  for (const [index, word] of words.entries()) {
    const ids = tokenizer.tokenize(word.text).ids;
    if (ids.length > 0 && pieces.length >= body) numTruncatedWords += 1;
    for (const id of ids) {
      pieces.push(id);
      pieceWords.push(index);
    }
  }
  const inputs = tokenizer.pack(pieces, sequenceLength);
  const wordIds = new Int32Array(sequenceLength).fill(-1);
  for (let i = 0; i < inputs.length - 2; i++) wordIds[i + 1] = pieceWords[i]!;
  return { words, inputs, wordIds, numTruncatedWords };
}

/** Positions of the first piece of each word, in order (where a word's tag is read). */
export function firstPiecePositions(wordIds: ArrayLike<number>): number[] {
  const positions: number[] = [];
  let previous = -1;
  for (let p = 0; p < wordIds.length; p++) {
    const word = wordIds[p]!;
    if (word >= 0 && word !== previous) positions.push(p);
    previous = word;
  }
  return positions;
}

/**
 * Word tags from the model's logits: the argmax (or, with `crf`, the Viterbi path over the
 * first pieces) at each word's first piece, "O" for words without a piece, then the IOB2
 * repair and the entity spans (`ner.decode_word_labels`, `repair_iob2`, `entity_spans`).
 *
 * @param prepared what {@link prepareNer} made of `text`.
 * @param logits `[position][label]` scores, at least the real positions (e.g. rows of the
 *     model's `[1, length, labels]` output, any bucket length).
 * @param labels the card's labels (IOB2 tags), in output order.
 * @param crf transitions of a CRF tagger, or `null` for argmax.
 * @param text the text `prepared` came from (for the spans' text).
 * @param precision the CRF's arithmetic: `"float64"` (golden vectors, Kotlin) by default,
 *     `"float32"` as `keras-attn predict` decodes a `.tflite` tagger.
 */
export function decodeNer(
  prepared: TaggerInputs,
  logits: readonly ArrayLike<number>[],
  labels: readonly string[],
  crf: CrfTransitions | null,
  text: string,
  precision: Precision = "float64",
): Entities {
  const first = firstPiecePositions(prepared.wordIds);
  const rows = first.map((p) => logitsRow(logits, p, labels.length));
  const best = crf === null ? rows.map((row) => argmax(row)) : crf.viterbi(rows, precision);
  const tags: (string | null)[] = prepared.words.map(() => null);
  for (const [i, p] of first.entries()) tags[prepared.wordIds[p]!] = labels[best[i]!]!;
  const numFilledWords = tags.filter((tag) => tag === null).length;
  const repaired = repairIob2(tags.map((tag) => tag ?? "O"));
  const spans = entitySpans(repaired.tags, prepared.words, text);
  return { words: prepared.words, tags: repaired.tags, spans, numFilledWords, numRepairs: repaired.repairs };
}

/** Row `position` of the logits, checked to hold `numLabels` scores. */
function logitsRow(logits: readonly ArrayLike<number>[], position: number, numLabels: number): ArrayLike<number> {
  const row = logits[position];
  if (row === undefined || row.length !== numLabels) {
    const got = row === undefined ? `${logits.length} positions` : `${row.length} scores`;
    throw new RangeError(`logits must hold ${numLabels} scores for position ${position} (got ${got})`);
  }
  return row;
}

/** Python's whitespace (`str.isspace`, the `\s` of `re`), which differs from JavaScript's `\s`. */
const PYTHON_WHITESPACE = /[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]/;

/**
 * True for "O", "B-TYPE" and "I-TYPE", TYPE non-empty and without whitespace
 * (`keras_attn.text.ner.IOB_TAG`).
 */
export function isIobTag(tag: string): boolean {
  if (tag === "O") return true;
  const prefix = tag[0] === "B" || tag[0] === "I";
  return tag.length >= 3 && prefix && tag[1] === "-" && !PYTHON_WHITESPACE.test(tag.substring(2));
}

/**
 * The conlleval repair: an `I-X` that continues no `X` entity starts one (`O I-X` -> `O B-X`,
 * `B-X I-Y` -> `B-X B-Y`), as `keras_attn.text.ner.repair_iob2`.
 *
 * Example:
 * ```ts
 * repairIob2(["O", "I-PER", "I-PER"]);  // {tags: ["O", "B-PER", "I-PER"], repairs: 1}
 * ```
 *
 * @throws Error on a tag that is not IOB2.
 */
export function repairIob2(tags: readonly string[]): { tags: string[]; repairs: number } {
  const repaired: string[] = [];
  let previousType: string | null = null;
  let repairs = 0;
  for (const [position, original] of tags.entries()) {
    if (!isIobTag(original)) {
      throw new Error(`malformed tag "${original}" at position ${position}: expected 'O', 'B-<TYPE>' or 'I-<TYPE>'`);
    }
    let tag = original;
    if (tag.startsWith("I-") && tag.substring(2) !== previousType) {
      tag = "B-" + tag.substring(2);
      repairs += 1;
    }
    repaired.push(tag);
    previousType = tag === "O" ? null : tag.substring(2);
  }
  return { tags: repaired, repairs };
}

/**
 * Entities of strict IOB2 tags (`B-X` then any `I-X`) with the words' character spans
 * (`keras_attn.text.ner.entity_spans`; an `I-X` that continues nothing belongs to no entity:
 * repair first).
 *
 * @throws RangeError when there is not one tag per word; Error on a tag that is not IOB2.
 */
export function entitySpans(tags: readonly string[], words: readonly Word[], text: string): EntitySpan[] {
  if (tags.length !== words.length) {
    throw new RangeError(`need one tag per word: ${tags.length} tags, ${words.length} words`);
  }
  const spans: EntitySpan[] = [];
  let start = -1;
  let type = "";
  for (let position = 0; position <= tags.length; position++) {
    const tag = position < tags.length ? tags[position]! : "O";
    if (!isIobTag(tag)) throw new Error(`malformed tag "${tag}" at position ${position}`);
    if (start >= 0 && !(tag.startsWith("I-") && tag.substring(2) === type)) {
      const startChar = words[start]!.start;
      const endChar = words[position - 1]!.end;
      const entityText = sliceCodePoints(text, startChar, endChar);
      spans.push({ type, startWord: start, endWord: position, startChar, endChar, text: entityText });
      start = -1;
    }
    if (tag.startsWith("B-")) {
      start = position;
      type = tag.substring(2);
    }
  }
  return spans;
}
