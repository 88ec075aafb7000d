import { CrfTransitions } from "./crf";
import { ModelAssetError } from "./errors";
import {
  type JsonObject,
  arrayField,
  asObject,
  booleanField,
  field,
  intField,
  objectField,
  parseJson,
  stringField,
  toInts,
  toNumbers,
} from "./json";
import { isIobTag } from "./ner";
import type { TextTables } from "./textTables";
import { WordPieceTokenizer } from "./wordPieceTokenizer";

/** The tasks with an on-device pipeline. */
export type Task = "classification" | "ner";

/** The special-token ids and word limit of a card's tokenizer. */
export interface TokenizerSettings {
  readonly lowercase: boolean;
  readonly stripAccents: boolean;
  readonly vocabularySize: number;
  readonly clsTokenId: number;
  readonly sepTokenId: number;
  readonly padTokenId: number;
  readonly unknownTokenId: number;
  /** HF's `max_input_chars_per_word`: a longer normalized word is one `[UNK]`. */
  readonly maxWordCharacters: number;
}

/**
 * The fields of an exported `model_card.json` that a device needs (written by
 * `keras_attn.runs.ModelCard.card_dict`; the Kotlin core's `ModelCard`), checked.
 *
 * Example:
 * ```ts
 * const card = ModelCard.parse(text, "model_card.json");
 * card.task;            // "classification" or "ner"
 * card.sequenceLength;  // the longest input length of the .tflite models
 * card.raw.metrics;     // any other field, as parsed
 * ```
 */
export class ModelCard {
  /** The `format` every card of this keras-attn version has. */
  static readonly FORMAT = "keras-attn model card 1";

  private constructor(
    /** The whole card as parsed (metrics, source run, version, ... for display). */
    readonly raw: JsonObject,
    readonly task: Task,
    readonly labels: readonly string[],
    /** The inputs' length (`serving_default`'s in a bucketed file). */
    readonly sequenceLength: number,
    readonly tokenizerSettings: TokenizerSettings,
    /** Input tensor names, in the card's order. */
    readonly inputNames: readonly string[],
    /** A CRF tagger's transitions, else `null`. */
    readonly crf: CrfTransitions | null,
  ) {}

  get isTagger(): boolean {
    return this.task === "ner";
  }

  get lowercase(): boolean {
    return this.tokenizerSettings.lowercase;
  }

  get stripAccents(): boolean {
    return this.tokenizerSettings.stripAccents;
  }

  get vocabularySize(): number {
    return this.tokenizerSettings.vocabularySize;
  }

  /**
   * Reads and checks a card.
   *
   * @param text the JSON document.
   * @param source file name for messages.
   * @throws ModelAssetError saying which field is wrong and how.
   */
  static parse(text: string, source = "model_card.json"): ModelCard {
    const root = asObject(parseJson(text, source), `${source}: the card`);
    const format = stringField(root, "format", source);
    if (format !== ModelCard.FORMAT) {
      throw new ModelAssetError(
        `${source}: format "${format}" is not "${ModelCard.FORMAT}": export the model with this keras-attn version`,
      );
    }
    const task = stringField(root, "task", source);
    if (task !== "classification" && task !== "ner") {
      throw new ModelAssetError(`${source}: task "${task}" has no on-device pipeline (classification or ner)`);
    }
    const labels = parseLabels(root, task, source);
    const length = intField(root, "sequence_length", source);
    if (length < 3) throw new ModelAssetError(`${source}: sequence_length must be >= 3, got ${length}`);
    const settings = parseTokenizer(objectField(root, "tokenizer", source), `${source}: tokenizer`);
    const inputs = parseInputs(root, length, source);
    const crf = parseCrf(root, task, labels.length, source);
    return new ModelCard(root, task, labels, length, settings, inputs, crf);
  }

  /**
   * A tokenizer over `vocabulary` (`vocab.txt` lines), checked against the card: its size
   * and special ids must be the card's.
   *
   * @throws ModelAssetError when the vocabulary is not the card's.
   */
  tokenizer(vocabulary: readonly string[], tables: TextTables, source = "vocab.txt"): WordPieceTokenizer {
    const settings = this.tokenizerSettings;
    if (vocabulary.length !== settings.vocabularySize) {
      throw new ModelAssetError(
        `${source} has ${vocabulary.length} tokens but the model card says ` +
          `vocabulary_size=${settings.vocabularySize}: copy vocab.txt from the same export directory as the model`,
      );
    }
    return new WordPieceTokenizer(vocabulary, settings.lowercase, tables, {
      maxWordCharacters: settings.maxWordCharacters,
      unknownToken: vocabulary[settings.unknownTokenId],
      clsToken: vocabulary[settings.clsTokenId],
      sepToken: vocabulary[settings.sepTokenId],
      padToken: vocabulary[settings.padTokenId],
    });
  }

  /** Checks `labels.txt` lines (empty lines ignored) against the card's labels. */
  checkLabels(lines: readonly string[], source = "labels.txt"): void {
    const fromFile = lines.filter((line) => line.length > 0);
    if (fromFile.length !== this.labels.length || fromFile.some((label, i) => label !== this.labels[i])) {
      throw new ModelAssetError(
        `${source} (${fromFile.length} labels) differs from the model card's labels ` +
          `(${this.labels.length}: ${this.labels.slice(0, 6).join(", ")}...): copy both from the same export directory`,
      );
    }
  }

  /**
   * Checks the model's tensor shapes against the card: every input `[1, sequenceLength]` and
   * the output `[1, labels]` (classifier) or `[1, sequenceLength, labels]` (tagger).
   *
   * @param inputShapes name -> shape of the model's inputs (of its longest signature).
   * @param outputShape shape of its (first) output.
   * @param source the model file name for the message.
   * @throws ModelAssetError when model and card come from different exports.
   */
  checkModelShapes(
    inputShapes: Readonly<Record<string, readonly number[]>>,
    outputShape: readonly number[],
    source: string,
  ): void {
    const names = Object.keys(inputShapes);
    for (const name of this.inputNames) {
      const shape = Object.hasOwn(inputShapes, name) ? inputShapes[name] : undefined;
      if (shape === undefined) {
        throw new ModelAssetError(
          `${source} has no input "${name}" (inputs: ${names.join(", ")}); ` +
            `the card expects ${this.inputNames.join(", ")}`,
        );
      }
      if (!sameShape(shape, [1, this.sequenceLength])) {
        throw new ModelAssetError(
          `${source} input "${name}" has shape [${shape.join(", ")}], ` +
            `the model card says [1, ${this.sequenceLength}]: ` +
            "model and card come from different exports (or --sequence-length differs)",
        );
      }
    }
    const n = this.labels.length;
    const expected = this.isTagger ? [1, this.sequenceLength, n] : [1, n];
    if (!sameShape(outputShape, expected)) {
      throw new ModelAssetError(
        `${source} output has shape [${outputShape.join(", ")}], expected [${expected.join(", ")}] ` +
          `(${n} labels in the card): model and card come from different exports`,
      );
    }
  }
}

function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((size, i) => size === b[i]);
}

function parseLabels(root: JsonObject, task: Task, source: string): string[] {
  const labels = arrayField(root, "labels", source).map((label, i) => {
    if (typeof label !== "string") throw new ModelAssetError(`${source}: labels[${i}] must be a string`);
    return label;
  });
  if (labels.length === 0) throw new ModelAssetError(`${source}: "labels" is empty`);
  if (task === "ner") {
    for (const label of labels) {
      if (!isIobTag(label)) {
        throw new ModelAssetError(`${source}: label "${label}" is not an IOB2 tag (O, B-TYPE, I-TYPE)`);
      }
    }
    if (!labels.includes("O")) throw new ModelAssetError(`${source}: a tagger's labels need the "O" tag`);
  }
  return labels;
}

function parseTokenizer(tokenizer: JsonObject, where: string): TokenizerSettings {
  const lowercase = booleanField(tokenizer, "lowercase", where);
  const stripAccents = booleanField(tokenizer, "strip_accents", where);
  if (lowercase !== stripAccents) {
    throw new ModelAssetError(
      `${where}: lowercase=${lowercase} with strip_accents=${stripAccents} is not supported ` +
        "on the device (the reference normalizer does both or neither)",
    );
  }
  const vocabularySize = intField(tokenizer, "vocabulary_size", where);
  const id = (key: string): number => {
    const value = intField(tokenizer, key, where);
    if (value < 0 || value >= vocabularySize) {
      throw new ModelAssetError(`${where}: ${key}=${value} is outside the vocabulary (size ${vocabularySize})`);
    }
    return value;
  };
  // Cards written before the tokenizer followed HF hold "max_word_bytes" (100, read as the
  // character limit).
  const hasBytes = Object.hasOwn(tokenizer, "max_word_bytes");
  return {
    lowercase,
    stripAccents,
    vocabularySize,
    clsTokenId: id("cls_token_id"),
    sepTokenId: id("sep_token_id"),
    padTokenId: id("pad_token_id"),
    unknownTokenId: id("unknown_token_id"),
    maxWordCharacters: intField(tokenizer, hasBytes ? "max_word_bytes" : "max_word_characters", where),
  };
}

function parseInputs(root: JsonObject, length: number, source: string): string[] {
  return arrayField(root, "inputs", source).map((input, i) => {
    const entry = asObject(input, `${source}: inputs[${i}]`);
    const shape = toInts(field(entry, "shape", `${source}: inputs[${i}]`), `${source}: inputs[${i}].shape`);
    if (!sameShape(shape, [1, length])) {
      throw new ModelAssetError(`${source}: inputs[${i}].shape [${shape.join(", ")}] is not [1, ${length}]`);
    }
    return stringField(entry, "name", `${source}: inputs[${i}]`);
  });
}

function parseCrf(root: JsonObject, task: Task, numLabels: number, source: string): CrfTransitions | null {
  const entry = root["crf"];
  if (entry === undefined || entry === null) return null;
  if (task !== "ner") throw new ModelAssetError(`${source}: only a tagger can have "crf" transitions`);
  const where = `${source}: crf`;
  const section = asObject(entry, `${source}: "crf"`);
  const rows = arrayField(section, "transitions", where);
  let crf: CrfTransitions;
  try {
    crf = new CrfTransitions(
      rows.map((row, i) => toNumbers(row, `${where}.transitions[${i}]`)),
      toNumbers(field(section, "start_transitions", where), `${where}.start_transitions`),
      toNumbers(field(section, "end_transitions", where), `${where}.end_transitions`),
    );
  } catch (error) {
    if (error instanceof RangeError) throw new ModelAssetError(`${where}: ${error.message}`);
    throw error;
  }
  if (crf.numTags !== numLabels) throw new ModelAssetError(`${where}: ${crf.numTags} tags, but ${numLabels} labels`);
  return crf;
}
