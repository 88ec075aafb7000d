/**
 * A keras-attn `.tflite` file in the browser: text in, the result `keras-attn predict --json`
 * prints out, on LiteRT.js (XNNPACK on the `wasm` accelerator by default).
 */
import { loadAndCompile, Tensor, type CompiledModel } from "@litertjs/core";

import * as core from "./core/index";
import { ensureRuntime, type RuntimeOptions } from "./runtime";

/** What `model.predict` returns: the JSON object of `keras-attn predict --json` (less `text`). */
export type PredictResult = core.PredictResult;

/** Options of `loadModel`: the runtime's, and a name for messages. */
export interface LoadModelOptions extends RuntimeOptions {
  /** The file's name in error messages (default: the URL's last part, or "model.tflite"). */
  name?: string;
}

/** Milliseconds of the stages of one prediction. */
export interface Timing {
  tokenizeMs: number;
  modelMs: number;
  decodeMs: number;
}

/** One prediction with what led to it: the result, the logits and how the text was run. */
export interface Run {
  result: PredictResult;
  /** Logits of the real tokens: one row for a classifier, one per token for a tagger. */
  logits: Float32Array[];
  /** The signature the text ran on and its length (the shortest that holds the tokens). */
  bucket: core.Bucket;
  /** Word pieces fed to the model, `[CLS]` and `[SEP]` included. */
  numTokens: number;
  /** Pieces (classifier) or words (tagger) cut because the text exceeds the longest length. */
  numTruncated: number;
  timing: Timing;
}

/** Where a model comes from: a URL, the file's bytes, or a `Blob` / `File` (a picker, a drop). */
export type ModelSource = string | URL | ArrayBuffer | Uint8Array | Blob;

/**
 * Loads a self-describing keras-attn `.tflite` file (model card, vocabulary and labels
 * embedded by `keras-attn export`) and compiles it with LiteRT.js.
 *
 * @example
 * ```ts
 * const model = await loadModel("models/model_int8_buckets.tflite");
 * model.card.task;                         // "classification"
 * await model.predict("a gripping film");  // {label: "1", probabilities: {"0": 0.03, "1": 0.97}}
 * ```
 * @throws core.ModelAssetError for a file that is not ours (not a `.tflite`, no metadata,
 *   files that disagree); RuntimeError when the browser cannot run it.
 */
export async function loadModel(source: ModelSource, options: LoadModelOptions = {}): Promise<TextModel> {
  const name = options.name ?? sourceName(source);
  const bytes = await readBytes(source, name);
  const assets = await core.readModelAssets(bytes, name);
  return withCompiled(bytes, name, options, (compiled) => new TextModel(name, assets, compiled));
}

/**
 * Compiles a file's `bytes` with LiteRT.js (the runtime loaded first) and wraps it with
 * `wrap`; the compiled model is freed when `wrap` throws.
 *
 * @throws core.ModelAssetError when LiteRT.js cannot load the file.
 */
export async function withCompiled<T>(
  bytes: Uint8Array, name: string, options: LoadModelOptions, wrap: (compiled: CompiledModel) => T,
): Promise<T> {
  await ensureRuntime(options);
  let compiled: CompiledModel;
  try {
    compiled = await loadAndCompile(bytes, {
      accelerator: options.accelerator ?? "wasm",
      cpuOptions: { numThreads: options.threads ?? 1 },
    });
  } catch (error) {
    throw new core.ModelAssetError(`${name}: LiteRT.js cannot load it (${(error as Error).message})`);
  }
  try {
    return wrap(compiled);
  } catch (error) {
    compiled.delete();
    throw error;
  }
}

/** A loaded model: `card`, `predict(text)`, `run(text)`; `delete()` frees its memory. */
export class TextModel {
  readonly buckets: core.LengthBuckets;
  private readonly outputName: string;

  constructor(
    readonly name: string,
    readonly assets: core.ModelAssets,
    private readonly compiled: CompiledModel,
  ) {
    const lengths: Record<string, number> = {};
    for (const [key, runner] of Object.entries(compiled.signatures)) {
      const ids = runner.getInputDetails().find((d) => d.name === "token_ids");
      if (!ids) {
        throw new core.ModelAssetError(
          `${name}: signature "${key}" has no token_ids input: keras-attn web models take ` +
            "token ids (the text-in model_text.tflite needs tf-text ops LiteRT.js lacks)");
      }
      lengths[key] = ids.shape[1];
    }
    this.buckets = new core.LengthBuckets(lengths);
    const runner = compiled.signatures[this.buckets.longest.signature];
    const outputs = runner.getOutputDetails();
    this.outputName = (outputs.find((d) => d.name === "logits") ?? outputs[0]).name;
    const shapes: Record<string, number[]> = {};
    for (const d of runner.getInputDetails()) shapes[d.name] = Array.from(d.shape);
    const output = outputs.find((d) => d.name === this.outputName)!;
    this.card.checkModelShapes(shapes, Array.from(output.shape), name);
  }

  /** The model card embedded in the file (task, labels, lengths, tokenizer, recipe...). */
  get card(): core.ModelCard {
    return this.assets.card;
  }

  /** `"classification"` or `"ner"`. */
  get task(): string {
    return this.card.task;
  }

  /** The result of `keras-attn predict --json` for `text` (less its `text` field). */
  async predict(text: string): Promise<PredictResult> {
    return (await this.run(text)).result;
  }

  /** `predict` with the logits, the bucket, the truncation and the timing. */
  async run(text: string): Promise<Run> {
    if (typeof text !== "string") {
      throw new TypeError(`predict(text): text must be a string, got ${typeof text}`);
    }
    return this.card.isTagger ? this.tag(text) : this.classify(text);
  }

  /** Frees the compiled model (the object cannot run afterwards). */
  delete(): void {
    this.compiled.delete();
  }

  private async classify(text: string): Promise<Run> {
    const t0 = performance.now();
    const inputs = this.assets.tokenizer.encode(text, this.card.sequenceLength);
    const bucket = this.buckets.pick(inputs.length);
    const t1 = performance.now();
    const flat = await this.infer(inputs, bucket);
    const t2 = performance.now();
    const logits = flat.slice(0, this.card.labels.length);
    const result = core.classificationResult(this.card.labels, logits);
    const timing = { tokenizeMs: t1 - t0, modelMs: t2 - t1, decodeMs: performance.now() - t2 };
    return { result, logits: [logits], bucket, numTokens: inputs.length,
      numTruncated: inputs.numTruncated, timing };
  }

  private async tag(text: string): Promise<Run> {
    const t0 = performance.now();
    const prepared = core.prepareNer(text, this.assets.tokenizer, this.assets.tables,
      this.card.stripAccents, this.card.sequenceLength);
    const bucket = this.buckets.pick(prepared.inputs.length);
    const t1 = performance.now();
    const flat = await this.infer(prepared.inputs, bucket);
    const t2 = performance.now();
    const width = this.card.labels.length;
    const logits = Array.from({ length: prepared.inputs.length },
      (_, i) => flat.slice(i * width, (i + 1) * width));
    const result = core.nerResult(prepared, logits, this.card, text);
    const timing = { tokenizeMs: t1 - t0, modelMs: t2 - t1, decodeMs: performance.now() - t2 };
    return { result, logits, bucket, numTokens: prepared.inputs.length,
      numTruncated: prepared.numTruncatedWords, timing };
  }

  /** Runs `bucket`'s signature on the inputs cut to its length; the flat float32 output. */
  private async infer(inputs: core.ModelInputs, bucket: core.Bucket): Promise<Float32Array> {
    const byName: Record<string, Int32Array> = {
      token_ids: inputs.tokenIds, segment_ids: inputs.segmentIds, padding_mask: inputs.paddingMask,
    };
    const tensors: Record<string, Tensor> = {};
    for (const name of this.card.inputNames) {
      tensors[name] = new Tensor(Int32Array.from(byName[name].subarray(0, bucket.length)),
        [1, bucket.length]);
    }
    try {
      const outputs = await this.compiled.run(bucket.signature, tensors);
      try {
        return Float32Array.from(outputs[this.outputName].toTypedArray() as Float32Array);
      } finally {
        for (const tensor of Object.values(outputs)) tensor.delete();
      }
    } finally {
      for (const tensor of Object.values(tensors)) tensor.delete();
    }
  }
}

/** The file name of a model source, for messages. */
export function sourceName(source: ModelSource): string {
  if (typeof Blob !== "undefined" && source instanceof Blob && "name" in source) {
    return (source as File).name;
  }
  if (typeof source === "string" || source instanceof URL) {
    const path = new URL(source.toString(), globalThis.location?.href ?? "file:///").pathname;
    return decodeURIComponent(path.split("/").pop() || "model.tflite");
  }
  return "model.tflite";
}

/** The bytes of a model source (fetched for a URL). */
export async function readBytes(source: ModelSource, name: string): Promise<Uint8Array> {
  if (source instanceof Uint8Array) return source;
  if (source instanceof ArrayBuffer) return new Uint8Array(source);
  if (typeof Blob !== "undefined" && source instanceof Blob) {
    return new Uint8Array(await source.arrayBuffer());
  }
  let response: Response;
  try {
    response = await fetch(source.toString());
  } catch (error) {
    throw new core.ModelAssetError(`${name}: cannot fetch ${source} (${(error as Error).message})`);
  }
  if (!response.ok) {
    throw new core.ModelAssetError(`${name}: fetching ${source} gave HTTP ${response.status}`);
  }
  return new Uint8Array(await response.arrayBuffer());
}
