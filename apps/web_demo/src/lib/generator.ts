/**
 * A keras-attn language model `.tflite` file in the browser: a prompt in, its continuation
 * out, streamed as it is decoded, on LiteRT.js; Python's `TextGenerator` on a
 * `GenerationFile` (`keras_attn/text_generation.py`, `keras_attn/export/tflite/generation_file.py`).
 *
 * The file has one signature, `decode_step`: one token `token_ids` `(1, 1)`, its position
 * `cache_update_index` `(1,)` and the key/value cache `(1, N, 2, M, h, dk)` (zeros at first)
 * in, the next token's `logits` `(1, V)` and the updated `cache` out. A prompt runs through it
 * one token at a time, then each chosen token, as in Python; the cache stays a LiteRT.js
 * tensor from one call to the next (no copy through JavaScript).
 */
import { Tensor, type CompiledModel } from "@litertjs/core";

import * as core from "./core/index";
import { type LoadModelOptions, type ModelSource, readBytes, sourceName, withCompiled } from "./model";

/** Where a generation stands after a token: passed to `onText` with the piece it added. */
export interface GenerationProgress {
  /** Tokens chosen so far. */
  step: number;
  /** The new ids so far (a stop token excluded). */
  ids: Int32Array;
  /** The text streamed so far (the pieces joined). */
  text: string;
}

/** Options of `generate`. */
export interface GenerateOptions extends core.SamplingOptions {
  /** New tokens at most. Default and limit: every position the prompt leaves. */
  maxNewTokens?: number;
  /**
   * Called with each piece of text as it is decoded (a character model: one character a
   * step; a character cut inside its UTF-8 bytes waits for the rest); the pieces add up to
   * the result's text. A returned promise is awaited before the next step (a page resolves it
   * on a new task, so the browser can paint; LiteRT.js' wasm calls never yield); the wait is
   * not counted in `timing`. Throwing stops the generation.
   */
  onText?: (piece: string, progress: GenerationProgress) => unknown;
}

/** A continuation and how it was made. */
export interface Generation {
  /** The continuation (without the prompt, without a stop token). */
  text: string;
  /** Its ids. */
  ids: Int32Array;
  /** The prompt's ids. */
  promptIds: Int32Array;
  /** Whether a stop token ended it (WordPiece models' `[SEP]`), rather than `maxNewTokens`. */
  stopped: boolean;
  /** The sampling seed used (the one given or a random one), null for greedy decoding. */
  seed: number | null;
  /** `decode_step` calls made (one per prompt token, then one per new token but the last). */
  modelCalls: number;
  /** Milliseconds: the prompt's steps, the new tokens' steps and their mean per token. */
  timing: { promptMs: number; generateMs: number; msPerToken: number };
}

/**
 * Loads a language model `.tflite` file written by `keras-attn export` (a `causal_lm` run;
 * card and vocabulary embedded) and compiles it with LiteRT.js.
 *
 * @example
 * ```ts
 * const generator = await loadGenerator("models/generation_int8.tflite");
 * const out = await generator.generate("ROMEO:", { maxNewTokens: 100, onText: (piece) => show(piece) });
 * out.text;
 * await generator.generate("ROMEO:", { sampler: "sample", topK: 10, seed: 1 });
 * ```
 * @throws core.ModelAssetError for a file that is not a language model file; RuntimeError
 *   when the browser cannot run it.
 */
export async function loadGenerator(source: ModelSource, options: LoadModelOptions = {}): Promise<GenerationModel> {
  const name = options.name ?? sourceName(source);
  const bytes = await readBytes(source, name);
  const assets = await core.readGenerationAssets(bytes, name);
  return withCompiled(bytes, name, options, (compiled) => new GenerationModel(name, assets, compiled));
}

/** A loaded language model file: `card`, `codec`, `generate(prompt)`; `delete()` frees its memory. */
export class GenerationModel {
  /** Positions of the file's cache: prompt + new tokens. */
  readonly positions: number;
  /** Logits per step (the vocabulary size). */
  readonly vocabularySize: number;
  private readonly cacheShape: number[];
  private readonly signature: string;

  constructor(
    readonly name: string,
    readonly assets: core.GenerationAssets,
    private readonly compiled: CompiledModel,
  ) {
    const card = this.card;
    this.signature = card.decodeStepSignature;
    const runner = compiled.signatures[this.signature];
    if (!runner) {
      throw new core.ModelAssetError(
        `${name} has no signature ${this.signature} (signatures: ${Object.keys(compiled.signatures).join(", ")}): ` +
          "file and card come from different exports");
    }
    const inputs = runner.getInputDetails();
    const cache = inputs.find((d) => d.name === "cache");
    const logits = runner.getOutputDetails().find((d) => d.name === "logits");
    if (!cache || !logits || !inputs.some((d) => d.name === "token_ids") || !inputs.some((d) => d.name === "cache_update_index")) {
      throw new core.ModelAssetError(
        `${name}: signature ${this.signature} lacks token_ids, cache_update_index, cache or logits: ` +
          "not a keras-attn language model file");
    }
    this.cacheShape = Array.from(cache.shape);
    this.positions = this.cacheShape[3]!;
    this.vocabularySize = logits.shape[logits.shape.length - 1]!;
    if (this.positions !== card.maxLength || this.vocabularySize !== card.vocabularySize) {
      throw new core.ModelAssetError(
        `${name}: the file has ${this.positions} positions and ${this.vocabularySize} logits, the card ` +
          `max_length ${card.maxLength} and vocabulary_size ${card.vocabularySize}: file and card disagree`);
    }
  }

  /** The embedded model card. */
  get card(): core.GenerationCard {
    return this.assets.card;
  }

  /** The text <-> ids of the embedded vocabulary. */
  get codec(): core.TextCodec {
    return this.assets.codec;
  }

  /**
   * The continuation of `prompt` (Python `TextGenerator.generate` on the file): greedy by
   * default, or sampled (`sampler: "sample"`, `temperature`, `topK`, `topP`, `seed`).
   *
   * @throws core.GenerationError for an empty prompt, one that leaves no position, or more
   *   new tokens than it leaves; RangeError for bad sampling settings.
   */
  async generate(prompt: string, options: GenerateOptions = {}): Promise<Generation> {
    if (typeof prompt !== "string") {
      throw new TypeError(`generate(prompt): prompt must be a string, got ${typeof prompt}`);
    }
    return this.generateIds(this.codec.encode(prompt), options);
  }

  /** `generate` from the prompt's ids (Python `generate_ids`, with the text streamed). */
  async generateIds(promptIds: ArrayLike<number>, options: GenerateOptions = {}): Promise<Generation> {
    const prompt = Int32Array.from(promptIds);
    const maxNewTokens = core.newTokenBudget(prompt.length, this.positions, options.maxNewTokens);
    core.checkSampling(options);
    const stream = new core.TextStream(this.codec);
    const onText = options.onText;
    const chosen: number[] = [];
    const show = (piece: string, step: number) =>
      (piece && onText ? onText(piece, { step, ids: Int32Array.from(stream.ids), text: stream.text }) : undefined);
    const session = this.session();
    try {
      const out = await core.generateTokens(session.step, prompt, {
        ...options, maxNewTokens, stopTokenIds: this.card.stopTokenIds,
        onToken: (token, i) => {
          chosen.push(token);
          return show(stream.add(token), i + 1);
        },
      });
      const rest = stream.finish();
      if (rest) await show(rest, chosen.length);
      const text = this.codec.decode(out.ids);
      return {
        text, ids: out.ids, promptIds: prompt, stopped: out.stopped, seed: out.seed, modelCalls: out.modelCalls,
        timing: { promptMs: out.promptMs, generateMs: out.generateMs, msPerToken: out.generateMs / Math.max(chosen.length, 1) },
      };
    } finally {
      session.close();
    }
  }

  /**
   * The next-token logits after each of `ids` (at most `positions`), the file called once per
   * token from an empty cache (Python `GenerationFile.sequence_logits`).
   */
  async sequenceLogits(ids: ArrayLike<number>): Promise<Float32Array[]> {
    if (ids.length > this.positions) {
      throw new core.GenerationError(`${ids.length} tokens asked for, ${this.name} holds ${this.positions} positions`);
    }
    const session = this.session();
    try {
      const logits: Float32Array[] = [];
      for (let i = 0; i < ids.length; i++) logits.push(await session.step(ids[i]!, i));
      return logits;
    } finally {
      session.close();
    }
  }

  /** Frees the compiled model (the object cannot run afterwards). */
  delete(): void {
    this.compiled.delete();
  }

  /** One generation's cache (a LiteRT.js tensor, zeros at first) and its step. */
  private session(): { step: (token: number, index: number) => Promise<Float32Array>; close(): void } {
    let cache = new Tensor(new Float32Array(this.cacheShape.reduce((a, b) => a * b, 1)), this.cacheShape);
    const step = async (token: number, index: number): Promise<Float32Array> => {
      const tokenIds = new Tensor(Int32Array.of(token), [1, 1]);
      const position = new Tensor(Int32Array.of(index), [1]);
      let outputs: Record<string, Tensor>;
      try {
        outputs = await this.compiled.run(this.signature, { token_ids: tokenIds, cache_update_index: position, cache });
      } finally {
        tokenIds.delete();
        position.delete();
      }
      try {
        const logits = Float32Array.from(outputs["logits"]!.toTypedArray() as Float32Array);
        cache.delete();
        cache = outputs["cache"]!;
        return logits;
      } finally {
        for (const [key, tensor] of Object.entries(outputs)) if (key !== "cache") tensor.delete();
      }
    };
    return { step, close: () => { if (!cache.deleted) cache.delete(); } };
  }
}
