import bundledTables from "../../../../../keras_attn/text/bert_text_tables.txt?raw";

import { ModelAssetError } from "./errors";

/**
 * Character classes of the tables: a character continues a word (`WORD`), separates words
 * (`WHITESPACE`), is dropped (`REMOVED`, word splitter only) or is a word of its own
 * (`SINGLE`: punctuation, CJK ideographs).
 */
export const CharClass = { WORD: 0, WHITESPACE: 1, REMOVED: 2, SINGLE: 3 } as const;
/** One of the {@link CharClass} values. */
export type CharClass = (typeof CharClass)[keyof typeof CharClass];

/**
 * Where the bundled tables come from: the repository's one copy, the Python library's, imported
 * here (not copied); the Android core's build copies the same file onto its class path.
 */
export const TEXT_TABLES_SOURCE = "keras_attn/text/bert_text_tables.txt";

const EMPTY: readonly number[] = Object.freeze([]);
const HANGUL_FIRST = 0xac00;
const HANGUL_LAST = 0xd7a3;
const MAX_CODE_POINT = 0x10ffff;

/** One line of a table section, with its 1-based line number in the file. */
interface Line {
  number: number;
  text: string;
}

/** Run-length classes: code points `starts[i]` up to `starts[i + 1] - 1` have `classes[i]`. */
class RunTable {
  constructor(
    private readonly starts: Int32Array,
    private readonly classes: Uint8Array,
  ) {}

  classOf(codePoint: number): CharClass {
    let low = 0;
    let high = this.starts.length - 1;
    while (low < high) {
      // The last run starting at or before codePoint.
      const middle = (low + high + 1) >>> 1;
      if (this.starts[middle]! <= codePoint) low = middle;
      else high = middle - 1;
    }
    return this.classes[low] as CharClass;
  }
}

/**
 * The per-code-point answers of the reference that the tokenizer and the word splitter look
 * up: HF `tokenizers`' `BertNormalizer` (uncased: clean text, NFD, nonspacing marks dropped,
 * lower-cased; cased: clean text only), `BertPreTokenizer`'s classes, and
 * `keras_attn.text.word_splitter`'s classes, as measured and written by
 * `tools/make_text_tables.py` into the Python library's file (this class is the port of the
 * Kotlin core's `TextTables`, which reads the same file).
 * The tables' `normalize_lowercase` / `normalize_strip_accents` sections serve only the
 * Python tokenizer's mixed modes and are not read here.
 *
 * Tables instead of `String.prototype.normalize` / `toLowerCase` / `\p{...}` regexps: those
 * follow the Unicode version of the browser, and no browser has HF's Unicode data or its
 * CJK ranges; the tables make every browser answer as the Python reference does.
 *
 * Example:
 * ```ts
 * const tables = TextTables.load();   // the copy bundled with this library
 * tables.normalize(0xc9, true);       // "É" -> [0x65] ("e")
 * ```
 */
export class TextTables {
  private static bundled: TextTables | undefined;

  private constructor(
    private readonly uncased: ReadonlyMap<number, readonly number[]>,
    private readonly cased: ReadonlyMap<number, readonly number[]>,
    private readonly hangulUncased: boolean,
    private readonly tokenizerClasses: RunTable,
    private readonly wordClassesStripAccents: RunTable,
    private readonly wordClassesKeepAccents: RunTable,
  ) {}

  /** The tables bundled with the library (parsed once, then shared). */
  static load(): TextTables {
    TextTables.bundled ??= TextTables.read(bundledTables, TEXT_TABLES_SOURCE);
    return TextTables.bundled;
  }

  /**
   * Reads tables in the format of `make_text_tables.py`.
   *
   * @param text the table file (ASCII).
   * @param source its name for error messages.
   * @throws ModelAssetError naming `source:line` on malformed content.
   */
  static read(text: string, source: string): TextTables {
    const sections = readSections(text, source);
    const section = (key: string): Line[] => {
      const lines = sections.get(key);
      if (lines === undefined) throw new ModelAssetError(`${source}: table "${key}" is missing`);
      return lines;
    };
    const uncased = new Map<number, readonly number[]>();
    const hangul = readNormalization(section("normalize_uncased"), uncased, source);
    const cased = new Map<number, readonly number[]>();
    readNormalization(section("normalize_cased"), cased, source);
    return new TextTables(
      uncased,
      cased,
      hangul,
      readRuns(section("tokenizer_classes"), "WSP", source),
      readRuns(section("word_classes_strip_accents"), "WSRP", source),
      readRuns(section("word_classes_keep_accents"), "WSRP", source),
    );
  }

  /**
   * What the reference normalizer makes of one code point: the code points it becomes (empty
   * when removed). CJK ideographs are not padded with spaces here: their class
   * ({@link tokenizerClass}) makes each a word. A lone UTF-16 surrogate (never in valid
   * UTF-8) is removed.
   *
   * @param codePoint the input code point.
   * @param lowercase uncased (lower-case, NFD, nonspacing marks dropped) or cased
   *     normalization (control characters removed, whitespace made a space).
   */
  normalize(codePoint: number, lowercase: boolean): readonly number[] {
    if (codePoint >= 0xd800 && codePoint <= 0xdfff) return EMPTY;
    const mapped = (lowercase ? this.uncased : this.cased).get(codePoint);
    if (mapped !== undefined) return mapped;
    if (lowercase && this.hangulUncased && codePoint >= HANGUL_FIRST && codePoint <= HANGUL_LAST) {
      return hangulDecomposition(codePoint);
    }
    return [codePoint];
  }

  /**
   * Pre-tokenization class of a normalized character: `WORD`, `WHITESPACE` or `SINGLE`
   * (punctuation, CJK ideographs).
   */
  tokenizerClass(codePoint: number): CharClass {
    return this.tokenizerClasses.classOf(codePoint);
  }

  /**
   * Word-splitter class of an original character: `WORD`, `WHITESPACE`, `REMOVED` or
   * `SINGLE` (`keras_attn.text.word_splitter.character_class`).
   */
  wordClass(codePoint: number, stripAccents: boolean): CharClass {
    const table = stripAccents ? this.wordClassesStripAccents : this.wordClassesKeepAccents;
    return table.classOf(codePoint);
  }
}

/** The lines of each `table NAME COUNT` section, checked against the counts and `end`. */
function readSections(text: string, source: string): Map<string, Line[]> {
  const sections = new Map<string, Line[]>();
  let current: Line[] | undefined;
  let name = "";
  let expected = 0;
  let ended = false;
  const lines = text.split(/\r\n|\r|\n/);
  for (const [index, line] of lines.entries()) {
    const where = `${source}:${index + 1}`;
    if (line.startsWith("#") || line.length === 0) continue;
    if (ended) throw new ModelAssetError(`${where}: text after "end"`);
    if (!line.startsWith("table ") && line !== "end") {
      if (current === undefined) throw new ModelAssetError(`${where}: line outside a table`);
      current.push({ number: index + 1, text: line });
      continue;
    }
    if (current !== undefined && current.length !== expected) {
      throw new ModelAssetError(
        `${where}: table ${name} has ${current.length} lines, its header says ${expected} (truncated file?)`,
      );
    }
    if (line === "end") {
      ended = true;
      continue;
    }
    const parts = line.split(" ");
    if (parts.length !== 3) throw new ModelAssetError(`${where}: bad table header "${line}"`);
    name = parts[1]!;
    expected = parseDecimal(parts[2]!, () => new ModelAssetError(`${where}: bad line count in "${line}"`));
    current = [];
    sections.set(name, current);
  }
  if (!ended) throw new ModelAssetError(`${source}: no "end" line (truncated file?)`);
  return sections;
}

function parseDecimal(text: string, error: () => Error): number {
  const value = /^[+-]?\d+$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(value) || Math.abs(value) > 0x7fffffff) throw error();
  return value;
}

function hex(text: string, source: string, line: number): number {
  if (!/^[+-]?[0-9A-Fa-f]+$/.test(text)) {
    throw new ModelAssetError(`${source}:${line}: "${text}" is not a hexadecimal code point`);
  }
  const value = parseInt(text, 16);
  if (value < 0 || value > MAX_CODE_POINT) throw new ModelAssetError(`${source}:${line}: U+${text} is out of range`);
  return value;
}

function decimal(text: string, source: string, line: number): number {
  return parseDecimal(text, () => new ModelAssetError(`${source}:${line}: "${text}" is not an integer`));
}

/**
 * Fills `map` from `R` (shifted), `T` (to one code point), `E` (erased) and `M` (many code
 * points) lines; returns whether Hangul syllables decompose (`H`).
 */
function readNormalization(lines: Line[], map: Map<number, readonly number[]>, source: string): boolean {
  let hangul = false;
  for (const { number, text } of lines) {
    const parts = text.split(" ");
    const kind = parts[0];
    if (kind === "H") {
      hangul = true;
    } else if (kind === "M") {
      if (parts.length < 2) throw new ModelAssetError(`${source}:${number}: bad line "${text}"`);
      map.set(hex(parts[1]!, source, number), parts.slice(2).map((part) => hex(part, source, number)));
    } else if (kind === "R" || kind === "T" || kind === "E") {
      if (parts.length !== (kind === "E" ? 4 : 5)) throw new ModelAssetError(`${source}:${number}: bad line "${text}"`);
      const start = hex(parts[1]!, source, number);
      const count = decimal(parts[2]!, source, number);
      const step = decimal(parts[3]!, source, number);
      for (let i = 0; i < count; i++) {
        const code = start + i * step;
        if (kind === "R") map.set(code, [code + decimal(parts[4]!, source, number)]);
        else if (kind === "T") map.set(code, [hex(parts[4]!, source, number)]);
        else map.set(code, EMPTY);
      }
    } else {
      throw new ModelAssetError(`${source}:${number}: unknown line "${text}"`);
    }
  }
  return hangul;
}

/** A class table of `C START LETTER` lines; `letters` are the allowed class letters. */
function readRuns(lines: Line[], letters: string, source: string): RunTable {
  const starts = new Int32Array(lines.length);
  const classes = new Uint8Array(lines.length);
  // Letters of a table map onto WORD, WHITESPACE, REMOVED, SINGLE.
  const classOfLetter: Record<string, CharClass> = { W: 0, S: 1, R: 2, P: 3 };
  for (const [i, { number, text }] of lines.entries()) {
    const parts = text.split(" ");
    if (parts.length !== 3 || parts[0] !== "C" || parts[2]!.length !== 1 || !letters.includes(parts[2]!)) {
      throw new ModelAssetError(`${source}:${number}: bad class line "${text}"`);
    }
    starts[i] = hex(parts[1]!, source, number);
    if (i > 0 && starts[i]! <= starts[i - 1]!) {
      throw new ModelAssetError(`${source}:${number}: class runs must be in increasing order`);
    }
    classes[i] = classOfLetter[parts[2]!]!;
  }
  if (starts.length === 0 || starts[0] !== 0) {
    throw new ModelAssetError(`${source}: a class table must start at U+0000`);
  }
  return new RunTable(starts, classes);
}

/** Canonical decomposition of a precomposed Hangul syllable (Unicode section 3.12). */
function hangulDecomposition(codePoint: number): number[] {
  const index = codePoint - HANGUL_FIRST;
  const lead = 0x1100 + Math.floor(index / 588);
  const vowel = 0x1161 + Math.floor((index % 588) / 28);
  const trail = index % 28;
  return trail === 0 ? [lead, vowel] : [lead, vowel, 0x11a7 + trail];
}
