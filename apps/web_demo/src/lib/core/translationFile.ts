/**
 * What a translation `.tflite` file of `keras-attn export` holds and how a source enters it:
 * its card (`model_card.json`, task `"seq2seq"`) and vocabulary, embedded in the zip after the
 * flatbuffer; the source ids (`Translator.source_ids` in Python: joined word pieces cut to
 * `max_length - 1`, then `[SEP]`) and the length bucket they run in
 * (`keras_attn/export/tflite/translation_file.py`).
 */
import { ModelAssetError } from "./errors";
import { type JsonObject, asObject, field, intField, parseJson, stringField, toInts } from "./json";
import { JoinedWordPieces } from "./joinedWordPieces";
import { CARD_FILE, VOCABULARY_FILE, isTFLite, readAssociatedFiles } from "./modelFile";
import { TextTables } from "./textTables";
import { WordPieceTokenizer } from "./wordPieceTokenizer";

/** The fields of a translation file's card that decoding needs, checked. */
export interface TranslationCard {
  /** The whole card as parsed. */
  readonly raw: JsonObject;
  /** Source pieces kept, `[SEP]` included. */
  readonly maxLength: number;
  /** Tokens generated at most, EOS included (the decoder cache holds one more: BOS). */
  readonly targetMaxLength: number;
  /** The source lengths of the `encode_{S}` / `decode_step_{S}` signatures, shortest first. */
  readonly sourceLengths: readonly number[];
  readonly lowercase: boolean;
  readonly numBeams: number;
  readonly lengthPenalty: number;
  readonly bosTokenId: number;
  readonly eosTokenId: number;
  readonly padTokenId: number;
  readonly joinerToken: string;
  /** Signature name templates, `{S}` the source length. */
  readonly encodeSignature: string;
  readonly decodeStepSignature: string;
}

/** Card, vocabulary and tokenizers of a translation file. */
export interface TranslationAssets {
  readonly card: TranslationCard;
  readonly vocabulary: readonly string[];
  readonly pieces: JoinedWordPieces;
}

/**
 * Reads and checks a translation card (`model_card.json` of a seq2seq export).
 *
 * @throws ModelAssetError naming the field that is wrong.
 */
export function parseTranslationCard(text: string, source = CARD_FILE): TranslationCard {
  const root = asObject(parseJson(text, source), `${source}: the card`);
  const task = stringField(root, "task", source);
  if (task !== "seq2seq") {
    throw new ModelAssetError(
      `${source}: task "${task}" is not "seq2seq": load a classifier or tagger with loadModel, ` +
        "a translation file with loadTranslator");
  }
  const positive = (key: string) => {
    const value = intField(root, key, source);
    if (value < 1) throw new ModelAssetError(`${source}: ${key} must be >= 1, got ${value}`);
    return value;
  };
  const number = (key: string) => {
    const value = field(root, key, source);
    if (typeof value !== "number" || !Number.isFinite(value)) {
      throw new ModelAssetError(`${source}: ${key} must be a number, got ${JSON.stringify(value)}`);
    }
    return value;
  };
  const lowercase = field(root, "lowercase", source);
  if (typeof lowercase !== "boolean") throw new ModelAssetError(`${source}: lowercase must be true or false`);
  const sourceLengths = toInts(field(root, "source_lengths", source), `${source}: source_lengths`)
    .slice().sort((a, b) => a - b);
  if (sourceLengths.length === 0 || sourceLengths[0]! < 1) {
    throw new ModelAssetError(`${source}: source_lengths must be a non-empty list of lengths >= 1`);
  }
  const signatures = root["signatures"] === undefined ? {} : asObject(root["signatures"], `${source}: signatures`);
  const template = (key: string, fallback: string) => {
    const value = signatures[key] ?? fallback;
    if (typeof value !== "string" || !value.includes("{S}")) {
      throw new ModelAssetError(`${source}: signatures.${key} must be a name with {S}, got ${JSON.stringify(value)}`);
    }
    return value;
  };
  return {
    raw: root,
    maxLength: positive("max_length"),
    targetMaxLength: positive("target_max_length"),
    sourceLengths,
    lowercase,
    numBeams: positive("num_beams"),
    lengthPenalty: number("length_penalty"),
    bosTokenId: intField(root, "bos_token_id", source),
    eosTokenId: intField(root, "eos_token_id", source),
    padTokenId: intField(root, "pad_token_id", source),
    joinerToken: stringField(root, "joiner_token", source),
    encodeSignature: template("encode", "encode_{S}"),
    decodeStepSignature: template("decode_step", "decode_step_{S}"),
  };
}

/**
 * The card, vocabulary and joined word pieces embedded in a translation `.tflite` file.
 *
 * @throws ModelAssetError when the file is no TFLite file, embeds no card or vocabulary, or
 *     they disagree (special ids outside the vocabulary, no joiner).
 */
export async function readTranslationAssets(
  model: Uint8Array | ArrayBuffer,
  source = "translation.tflite",
  tables: TextTables = TextTables.load(),
): Promise<TranslationAssets> {
  const bytes = model instanceof Uint8Array ? model : new Uint8Array(model);
  if (!isTFLite(bytes)) {
    throw new ModelAssetError(
      `${source} is not a TFLite file (no TFL3 identifier at byte 4): choose a ` +
        "translation_<variant>.tflite file of a keras-attn export");
  }
  const files = await readAssociatedFiles(bytes, source);
  const text = (name: string) => {
    const data = files.get(name);
    if (data === undefined) {
      throw new ModelAssetError(
        `${source} embeds no ${name}: it is not a translation file of \`keras-attn export\` ` +
          "(export the seq2seq run again)");
    }
    return new TextDecoder("utf-8").decode(data);
  };
  const card = parseTranslationCard(text(CARD_FILE), `${source}:${CARD_FILE}`);
  // Python reads it with str.splitlines().
  const vocabulary = text(VOCABULARY_FILE).split(/\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/);
  if (vocabulary[vocabulary.length - 1] === "") vocabulary.pop();
  for (const [key, id] of [["bos_token_id", card.bosTokenId], ["eos_token_id", card.eosTokenId],
    ["pad_token_id", card.padTokenId]] as const) {
    if (id < 0 || id >= vocabulary.length) {
      throw new ModelAssetError(`${source}:${CARD_FILE}: ${key}=${id} is outside the vocabulary (size ${vocabulary.length})`);
    }
  }
  const tokenizer = new WordPieceTokenizer(vocabulary, card.lowercase, tables, {
    padToken: vocabulary[card.padTokenId], clsToken: vocabulary[card.bosTokenId], sepToken: vocabulary[card.eosTokenId],
  });
  return { card, vocabulary, pieces: new JoinedWordPieces(tokenizer, vocabulary, card.joinerToken) };
}

/** The source ids of `text` (Python `Translator.source_ids`): pieces cut to `maxLength - 1`, then EOS. */
export function sourceIds(pieces: JoinedWordPieces, card: TranslationCard, text: string): Int32Array {
  const ids = pieces.encode(text);
  const kept = ids.subarray(0, card.maxLength - 1);
  const out = new Int32Array(kept.length + 1);
  out.set(kept);
  out[kept.length] = card.eosTokenId;
  return out;
}

/**
 * The shortest source length of the file that holds `length` ids.
 *
 * @throws RangeError when the longest is too short (cut the source to the card's max_length).
 */
export function sourceBucket(card: TranslationCard, length: number): number {
  const bucket = card.sourceLengths.find((n) => n >= length);
  if (bucket === undefined) {
    throw new RangeError(
      `a source of ${length} tokens is longer than the file's longest source length ` +
        `${card.sourceLengths[card.sourceLengths.length - 1]}: cut it to the card's max_length`);
  }
  return bucket;
}

/** The text of generated ids up to the first EOS (Python `Translator.text`). */
export function translationText(pieces: JoinedWordPieces, card: TranslationCard, ids: ArrayLike<number>): string {
  const all = Array.from(ids);
  const end = all.indexOf(card.eosTokenId);
  return pieces.decode(end >= 0 ? all.slice(0, end) : all);
}
