/**
 * What a language model `.tflite` file of `keras-attn export` holds (a `causal_lm` run,
 * `keras_attn/stages/generation_exporter.py`): its card (`model_card.json`, task
 * `"causal_lm"`) and vocabulary (`characters.json` or `vocab.txt`), embedded in the zip after
 * the flatbuffer, and the limits of a prompt and its continuation in the file's positions
 * (Python `TextGenerator.generate` / `generate_ids`, with the same messages).
 */
import { ModelAssetError } from "./errors";
import { type JsonObject, asObject, field, intField, parseJson, stringField, toInts } from "./json";
import { CARD_FILE, isTFLite, readAssociatedFiles } from "./modelFile";
import { CHARACTERS_FILE, TextCodec, WORDPIECE_FILE } from "./textCodec";
import { TextTables } from "./textTables";

/**
 * A prompt or setting a language model cannot generate with (Python's `GenerationError`):
 * an empty prompt, one longer than the positions, too many new tokens. The message says what
 * to change, so a page can show it as it is.
 */
export class GenerationError extends RangeError {
  constructor(message: string) {
    super(message);
    this.name = "GenerationError";
  }
}

/** The task of a language model card. */
export const GENERATION_TASK = "causal_lm";

/** The fields of a language model file's card that generation needs, checked. */
export interface GenerationCard {
  /** The whole card as parsed. */
  readonly raw: JsonObject;
  /** Positions of the model: prompt + generated tokens. */
  readonly maxLength: number;
  /** `"characters"`, `"bytes"` or `"wordpiece"`. */
  readonly tokenizer: "characters" | "bytes" | "wordpiece";
  readonly lowercase: boolean;
  /** `characters.json` or `vocab.txt`. */
  readonly vocabularyFile: string;
  readonly vocabularySize: number;
  readonly stopTokenIds: readonly number[];
  readonly padTokenId: number;
  /** The name of the one-token step signature. */
  readonly decodeStepSignature: string;
}

/** Card and codec of a language model file. */
export interface GenerationAssets {
  readonly card: GenerationCard;
  readonly codec: TextCodec;
}

/**
 * Reads and checks a language model card (`model_card.json` of a causal_lm export).
 *
 * @throws ModelAssetError naming the field that is wrong.
 */
export function parseGenerationCard(text: string, source = CARD_FILE): GenerationCard {
  const root = asObject(parseJson(text, source), `${source}: the card`);
  const task = stringField(root, "task", source);
  if (task !== GENERATION_TASK) {
    throw new ModelAssetError(
      `${source}: task "${task}" is not "${GENERATION_TASK}": load a language model file with ` +
        "loadGenerator, a translation file with loadTranslator, a classifier or tagger with loadModel");
  }
  const positive = (key: string) => {
    const value = intField(root, key, source);
    if (value < 1) throw new ModelAssetError(`${source}: ${key} must be >= 1, got ${value}`);
    return value;
  };
  const tokenizer = stringField(root, "tokenizer", source);
  if (tokenizer !== "characters" && tokenizer !== "bytes" && tokenizer !== "wordpiece") {
    throw new ModelAssetError(`${source}: tokenizer must be "characters", "bytes" or "wordpiece", got "${tokenizer}"`);
  }
  const lowercase = root["lowercase"] ?? false;
  if (typeof lowercase !== "boolean") throw new ModelAssetError(`${source}: lowercase must be true or false`);
  const signatures = root["signatures"] === undefined ? {} : asObject(root["signatures"], `${source}: signatures`);
  const decodeStep = signatures["decode_step"] ?? "decode_step";
  if (typeof decodeStep !== "string" || decodeStep === "") {
    throw new ModelAssetError(`${source}: signatures.decode_step must be a signature name, got ${JSON.stringify(decodeStep)}`);
  }
  return {
    raw: root,
    maxLength: positive("max_length"),
    tokenizer,
    lowercase,
    vocabularyFile: stringField(root, "vocabulary_file", source),
    vocabularySize: positive("vocabulary_size"),
    stopTokenIds: toInts(field(root, "stop_token_ids", source), `${source}: stop_token_ids`),
    padTokenId: intField(root, "pad_token_id", source),
    decodeStepSignature: decodeStep,
  };
}

/**
 * The card and codec embedded in a language model `.tflite` file.
 *
 * @throws ModelAssetError when the file is no TFLite file, embeds no card or vocabulary, or
 *     they disagree (vocabulary size, stop tokens).
 */
export async function readGenerationAssets(
  model: Uint8Array | ArrayBuffer,
  source = "generation.tflite",
  tables?: TextTables,
): Promise<GenerationAssets> {
  const bytes = model instanceof Uint8Array ? model : new Uint8Array(model);
  if (!isTFLite(bytes)) {
    throw new ModelAssetError(
      `${source} is not a TFLite file (no TFL3 identifier at byte 4): choose a ` +
        "generation_<variant>.tflite file of a keras-attn export");
  }
  const files = await readAssociatedFiles(bytes, source);
  const text = (name: string) => {
    const data = files.get(name);
    if (data === undefined) {
      throw new ModelAssetError(
        `${source} embeds no ${name}: it is not a language model file of \`keras-attn export\` ` +
          "(export the causal_lm run again)");
    }
    return new TextDecoder("utf-8").decode(data);
  };
  const card = parseGenerationCard(text(CARD_FILE), `${source}:${CARD_FILE}`);
  const expected = card.tokenizer === "wordpiece" ? WORDPIECE_FILE : CHARACTERS_FILE;
  if (card.vocabularyFile !== expected) {
    throw new ModelAssetError(`${source}:${CARD_FILE}: a ${card.tokenizer} model's vocabulary_file is ${expected}, got ${card.vocabularyFile}`);
  }
  const where = `${source}:${card.vocabularyFile}`;
  const codec = card.tokenizer === "wordpiece"
    ? TextCodec.fromWordPieces(text(card.vocabularyFile), card.lowercase, tables ?? TextTables.load(), where)
    : TextCodec.fromCharacters(text(card.vocabularyFile), where);
  if (codec.kind !== card.tokenizer) {
    throw new ModelAssetError(`${where}: a ${codec.kind} vocabulary, the card says ${card.tokenizer}`);
  }
  if (codec.vocabularySize !== card.vocabularySize) {
    throw new ModelAssetError(
      `${where} holds ${codec.vocabularySize} tokens, the card's vocabulary_size is ${card.vocabularySize}: file and card disagree`);
  }
  if (card.stopTokenIds.join() !== codec.stopTokenIds.join()) {
    throw new ModelAssetError(
      `${source}:${CARD_FILE}: stop_token_ids [${card.stopTokenIds.join(", ")}], the vocabulary's are [${codec.stopTokenIds.join(", ")}]`);
  }
  return { card, codec };
}

/**
 * The number of new tokens a prompt of `promptLength` tokens gets (`maxNewTokens`, default:
 * every position left), checked as Python's `generate` / `generate_ids` check it.
 *
 * @throws GenerationError for an empty prompt, a prompt that leaves no position, or more new
 *     tokens than the positions left.
 */
export function newTokenBudget(promptLength: number, positions: number, maxNewTokens?: number | null): number {
  if (promptLength < 1) {
    throw new GenerationError("the prompt is empty: give at least one character (or word) for the model to continue");
  }
  const room = positions - promptLength;
  if (room < 1) {
    throw new GenerationError(
      `the prompt is ${promptLength} tokens, the model has ${positions} positions: shorten the ` +
        "prompt (its last words carry most of what comes next)");
  }
  if (maxNewTokens === undefined || maxNewTokens === null) return room;
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1) {
    throw new GenerationError(`maxNewTokens must be an integer >= 1. Received: maxNewTokens=${maxNewTokens}`);
  }
  if (maxNewTokens > room) {
    throw new GenerationError(
      `${maxNewTokens} new tokens after a prompt of ${promptLength} do not fit the model's ` +
        `${positions} positions: ask for at most ${room}`);
  }
  return maxNewTokens;
}
