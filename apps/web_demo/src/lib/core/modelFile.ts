import { ModelAssetError } from "./errors";
import { ModelCard } from "./modelCard";
import { TextTables } from "./textTables";
import type { WordPieceTokenizer } from "./wordPieceTokenizer";

/** The embedded model card. */
export const CARD_FILE = "model_card.json";
/** The embedded vocabulary, one token a line. */
export const VOCABULARY_FILE = "vocab.txt";
/** The embedded labels, one a line, in output order. */
export const LABELS_FILE = "labels.txt";

const END_RECORD = 0x06054b50;
const CENTRAL_ENTRY = 0x02014b50;
const LOCAL_ENTRY = 0x04034b50;
const HOW_TO_EXPORT =
  "export the model with `keras-attn export`, which embeds model_card.json, vocab.txt and labels.txt " +
  "in every model_<variant>.tflite";

/** The card, vocabulary and tokenizer of a model, read from its file and checked. */
export interface ModelAssets {
  readonly card: ModelCard;
  /** The `vocab.txt` lines (index = token id). */
  readonly vocabulary: readonly string[];
  readonly tokenizer: WordPieceTokenizer;
  /** The text tables the tokenizer uses (for `prepareNer`). */
  readonly tables: TextTables;
}

/** True when `model` starts like a TFLite flatbuffer (file identifier `TFL3` at byte 4). */
export function isTFLite(model: Uint8Array): boolean {
  return model.length >= 8 && String.fromCharCode(...model.subarray(4, 8)) === "TFL3";
}

/**
 * The files packed into a `.tflite` file (`keras_attn.export.tflite.tflite_metadata`): name ->
 * bytes, in archive order; empty when it carries none (the Kotlin core's
 * `ModelFile.associatedFiles`).
 *
 * A `.tflite` file with TFLite metadata is the model flatbuffer followed by a zip archive of
 * its associated files, the layout of the TFLite metadata convention. The zip's end record is
 * at the end of the file, so the files are found from there, as any zip reader does; entry
 * offsets are taken relative to where the central directory really is, which also reads
 * archives whose offsets count from the start of the zip rather than of the file. Stored and
 * deflated entries are read (deflated with the web-standard `DecompressionStream`).
 *
 * Example:
 * ```ts
 * const files = await readAssociatedFiles(new Uint8Array(await file.arrayBuffer()), file.name);
 * new TextDecoder().decode(files.get("labels.txt"));  // "negative\npositive\n"
 * ```
 *
 * @param model the whole file.
 * @param source file name for messages.
 * @throws ModelAssetError when the archive is damaged or uses another compression.
 */
export async function readAssociatedFiles(
  model: Uint8Array,
  source = "model.tflite",
): Promise<Map<string, Uint8Array>> {
  const zip = new ZipReader(model, source);
  const end = zip.findEndRecord();
  const files = new Map<string, Uint8Array>();
  if (end < 0) return files;
  const count = zip.u16(end + 10);
  const directorySize = zip.u32(end + 12);
  const shift = end - directorySize - zip.u32(end + 16); // bytes before the zip
  let entry = end - directorySize;
  for (let i = 0; i < count; i++) {
    if (entry < 0 || zip.u32(entry) !== CENTRAL_ENTRY) {
      throw new ModelAssetError(`${source}: damaged zip directory of the embedded files`);
    }
    const nameLength = zip.u16(entry + 28);
    const name = new TextDecoder().decode(zip.slice(entry + 46, nameLength)); // lenient: only a key
    files.set(name, await zip.entryData(entry, shift, name));
    entry += 46 + nameLength + zip.u16(entry + 30) + zip.u16(entry + 32);
  }
  return files;
}

/**
 * The card, vocabulary and tokenizer embedded in a keras-attn `.tflite` file, checked as the
 * side files are ({@link ModelCard.tokenizer}, {@link ModelCard.checkLabels}): the Kotlin
 * core's `ModelFile.assets`. One file is enough to tokenize, run and decode.
 *
 * Example:
 * ```ts
 * const assets = await readModelAssets(bytes, "model_int8.tflite");
 * assets.card.labels;  // from the embedded model_card.json
 * assets.tokenizer.encode("a good film", assets.card.sequenceLength);
 * ```
 *
 * @param model the whole file (bytes or buffer).
 * @param source file name for messages.
 * @param tables the text tables (the bundled ones by default).
 * @throws ModelAssetError when the file is no TFLite file, embeds no model card, or its
 *     files disagree.
 */
export async function readModelAssets(
  model: Uint8Array | ArrayBuffer,
  source = "model.tflite",
  tables: TextTables = TextTables.load(),
): Promise<ModelAssets> {
  const bytes = model instanceof Uint8Array ? model : new Uint8Array(model);
  if (!isTFLite(bytes)) {
    throw new ModelAssetError(
      `${source} is not a TFLite file (no TFL3 identifier at byte 4): ` +
        "choose a model_<variant>.tflite file of a keras-attn export",
    );
  }
  const files = await readAssociatedFiles(bytes, source);
  const text = (name: string): string => {
    const data = files.get(name);
    if (data !== undefined) return utf8(data, `${source}:${name}`);
    const listed = files.size > 0 ? `embedded files: ${[...files.keys()].join(", ")}` : "it embeds no files";
    throw new ModelAssetError(
      `${source} embeds no ${name} (${listed}): it is not a self-describing keras-attn model; ${HOW_TO_EXPORT}`,
    );
  };
  const cardText = text(CARD_FILE);
  if (isTranslationCard(cardText)) {
    throw new ModelAssetError(
      `${source} is a translation file (task "seq2seq" in its ${CARD_FILE}): load it with ` +
        "loadTranslator, which encodes, decodes and detokenizes; loadModel takes classifiers and taggers");
  }
  const card = ModelCard.parse(cardText, `${source}:${CARD_FILE}`);
  const vocabulary = lines(text(VOCABULARY_FILE));
  const tokenizer = card.tokenizer(vocabulary, tables, `${source}:${VOCABULARY_FILE}`);
  card.checkLabels(lines(text(LABELS_FILE)), `${source}:${LABELS_FILE}`);
  return { card, vocabulary, tokenizer, tables };
}

/** True for the card of a translation file (task "seq2seq"); false for any other text. */
function isTranslationCard(text: string): boolean {
  try {
    const root: unknown = JSON.parse(text);
    return typeof root === "object" && root !== null && (root as { task?: unknown }).task === "seq2seq";
  } catch {
    return false; // ModelCard.parse says what is wrong
  }
}

/** UTF-8 bytes as text, as Python's `bytes.decode("utf-8")` (a byte order mark is kept). */
function utf8(data: Uint8Array, where: string): string {
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(data);
  } catch {
    throw new ModelAssetError(`${where} is not UTF-8 text: the file is damaged; export the model again`);
  }
}

/** The lines of a text file, without the trailing empty ones. */
function lines(text: string): string[] {
  const result = text.split("\n");
  while (result.length > 0 && result[result.length - 1] === "") result.pop();
  return result;
}

/** Bounds-checked little-endian reads of a zip archive at the end of `bytes`. */
class ZipReader {
  private readonly view: DataView;

  constructor(
    private readonly bytes: Uint8Array,
    private readonly source: string,
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  /** Offset of the end-of-central-directory record (searched back over a comment), or -1. */
  findEndRecord(): number {
    const size = this.bytes.length;
    for (let p = size - 22; p >= Math.max(0, size - 22 - 0xffff); p--) {
      if (this.view.getUint32(p, true) === END_RECORD) return p;
    }
    return -1;
  }

  u16(at: number): number {
    this.check(at, 2);
    return this.view.getUint16(at, true);
  }

  u32(at: number): number {
    this.check(at, 4);
    return this.view.getUint32(at, true);
  }

  slice(at: number, length: number): Uint8Array<ArrayBuffer> {
    this.check(at, length);
    return this.bytes.slice(at, at + length);
  }

  /** The bytes of the file of central directory entry `entry`, inflated if deflated. */
  async entryData(entry: number, shift: number, name: string): Promise<Uint8Array> {
    const method = this.u16(entry + 10);
    const packedSize = this.u32(entry + 20);
    const fileSize = this.u32(entry + 24);
    const local = this.u32(entry + 42) + shift;
    if (local < 0 || local + 30 > this.bytes.length || this.u32(local) !== LOCAL_ENTRY) {
      throw new ModelAssetError(`${this.source}: damaged zip entry ${name}`);
    }
    const data = this.slice(local + 30 + this.u16(local + 26) + this.u16(local + 28), packedSize);
    if (method === 0) return data;
    if (method === 8) return inflate(data, fileSize, `${this.source}: ${name}`);
    throw new ModelAssetError(
      `${this.source}: ${name} uses zip compression method ${method} (stored or deflated expected)`,
    );
  }

  private check(at: number, length: number): void {
    if (at < 0 || length < 0 || at + length > this.bytes.length) {
      throw new ModelAssetError(`${this.source}: zip entry outside the file (damaged or truncated file?)`);
    }
  }
}

/** Raw deflate data (zip method 8) -> `size` bytes. */
async function inflate(data: Uint8Array<ArrayBuffer>, size: number, where: string): Promise<Uint8Array> {
  let out: Uint8Array;
  try {
    const stream = new Blob([data]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    out = new Uint8Array(await new Response(stream).arrayBuffer());
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new ModelAssetError(`${where}: damaged deflated data (${reason})`);
  }
  if (out.length !== size) {
    throw new ModelAssetError(`${where}: deflated data gives ${out.length} bytes, the zip says ${size}`);
  }
  return out;
}
