/**
 * A keras-attn translation `.tflite` file in the browser: text in, translation out, on
 * LiteRT.js, with the greedy decoding and beam search of Python's `Translator` on a
 * `TranslationFile` (the same source ids, buckets, cache and token rules).
 *
 * The file has two signatures per source length S: `encode_{S}` (source ids and mask `(1, S)`
 * -> the cross-attention cache `(1, 2N, S, h, dk)`) and `decode_step_{S}` (one token, its
 * position, the self-attention cache `(1, N, 2, M, h, dk)`, zeros at first, the cross cache
 * and the mask -> the next token's logits `(1, V)` and the updated self-attention cache). The
 * file has batch 1: one `decode_step` call per beam and step.
 */
import { Tensor, type CompiledModel } from "@litertjs/core";

import * as core from "./core/index";
import {
  type TranslationAssets,
  type TranslationCard,
  readTranslationAssets,
  sourceBucket,
  sourceIds,
  translationText,
} from "./core/translationFile";
import { type LoadModelOptions, type ModelSource, readBytes, sourceName, withCompiled } from "./model";

/** Options of `translate`. */
export interface TranslateOptions {
  /** Beam width; 1 is greedy decoding. Default: the card's `num_beams`. */
  beams?: number;
  /** Tokens generated at most (EOS included). Default and limit: the card's `target_max_length`. */
  maxLength?: number;
  /** Length penalty of the beam score. Default: the card's `length_penalty`. */
  lengthPenalty?: number;
  /**
   * Called after each decoding step with the text so far: greedy decoding's tokens, or the
   * best live beam's (the final translation may be another beam's). A returned promise is
   * awaited before the next step (a page resolves it on a new task, so the browser can paint
   * each token: LiteRT.js' wasm calls never yield); the wait is not counted in `timing`.
   */
  onToken?: (partial: { text: string; tokens: Int32Array; step: number }) => unknown;
}

/** A translation and how it was made. */
export interface Translation {
  text: string;
  /** Generated ids up to EOS (excluded). */
  tokens: Int32Array;
  /** The source ids fed to the encoder (`[SEP]` last). */
  sourceIds: Int32Array;
  /** The source length signature the text ran in. */
  sourceLength: number;
  /** Beam score `sum log p / L ** lp` (NaN for greedy decoding). */
  score: number;
  /** `decode_step` calls made. */
  modelCalls: number;
  timing: { encodeMs: number; decodeMs: number };
}

/**
 * Loads a translation `.tflite` file written by `keras-attn export` (its card and vocabulary
 * embedded) and compiles it with LiteRT.js.
 *
 * @example
 * ```ts
 * const translator = await loadTranslator("models/translation_int8.tflite");
 * (await translator.translate("A man rides a bike.", { onToken: (p) => show(p.text) })).text;
 * ```
 * @throws core.ModelAssetError for a file that is not a translation file; RuntimeError when
 *   the browser cannot run it.
 */
export async function loadTranslator(source: ModelSource, options: LoadModelOptions = {}): Promise<TranslationModel> {
  const name = options.name ?? sourceName(source);
  const bytes = await readBytes(source, name);
  const assets = await readTranslationAssets(bytes, name);
  return withCompiled(bytes, name, options,
    (compiled) => new TranslationModel(name, assets, compiled));
}

/** The per-row decoding cache: the self-attention cache of one beam, a LiteRT.js tensor. */
type RowCache = Tensor;

/** A loaded translation file: `card`, `translate(text)`; `delete()` frees its memory. */
export class TranslationModel {
  /** Decoder positions of the cache (BOS + generated tokens). */
  readonly cachePositions: number;
  private readonly cacheShape: number[];

  constructor(
    readonly name: string,
    readonly assets: TranslationAssets,
    private readonly compiled: CompiledModel,
  ) {
    const card = this.card;
    let cacheShape: number[] | null = null;
    for (const length of card.sourceLengths) {
      const step = this.runner(card.decodeStepSignature, length);
      this.runner(card.encodeSignature, length);
      const inputs = step.getInputDetails();
      const self = inputs.find((d) => d.name === "self_attention_cache");
      const cross = inputs.find((d) => d.name === "cross_attention_cache");
      if (!self || !cross) {
        throw new core.ModelAssetError(
          `${name}: signature ${this.signature(card.decodeStepSignature, length)} has no ` +
            "self_attention_cache / cross_attention_cache input: not a keras-attn translation file");
      }
      cacheShape ??= Array.from(self.shape);
    }
    this.cacheShape = cacheShape!;
    this.cachePositions = this.cacheShape[3]!;
    if (this.cachePositions < 1 + card.targetMaxLength) {
      throw new core.ModelAssetError(
        `${name}: its cache holds ${this.cachePositions} positions, the card's target_max_length ` +
          `${card.targetMaxLength} needs ${1 + card.targetMaxLength}: file and card disagree`);
    }
  }

  /** The embedded model card. */
  get card(): TranslationCard {
    return this.assets.card;
  }

  /** The translation of `text` (Python `Translator.translate` on the file, one text). */
  async translate(text: string, options: TranslateOptions = {}): Promise<Translation> {
    if (typeof text !== "string") {
      throw new TypeError(`translate(text): text must be a string, got ${typeof text}`);
    }
    return this.translateIds(sourceIds(this.assets.pieces, this.card, text), options);
  }

  /** The translation of source ids (`[SEP]` last, at most the card's max_length). */
  async translateIds(ids: Int32Array, options: TranslateOptions = {}): Promise<Translation> {
    const card = this.card;
    const beams = options.beams ?? card.numBeams;
    const maxNewTokens = options.maxLength ?? card.targetMaxLength;
    if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1 || maxNewTokens > this.cachePositions - 1) {
      throw new RangeError(
        `maxLength must be an integer in [1, ${this.cachePositions - 1}] (the file's cache). ` +
          `Received: maxLength=${maxNewTokens}`);
    }
    const length = sourceBucket(card, ids.length);
    const signature = this.signature(card.decodeStepSignature, length);
    // The sentence's tensors stay in LiteRT.js between calls (no copy JS <-> wasm of the
    // caches): the mask and the cross-attention cache, made once and read by every step and
    // row, and the rows' self-attention caches, each the tensor its parent's step returned
    // (beam search hands one parent to several beams: they only read it). `rowCaches` holds
    // every row cache made and not yet freed; a step frees those the search no longer passes
    // (the caches a step receives are all it holds), the end (or an error) frees the rest.
    const shared: Tensor[] = [];
    const rowCaches = new Set<Tensor>();
    try {
      const t0 = performance.now();
      const tokenIds = new Int32Array(length).fill(card.padTokenId);
      tokenIds.set(ids);
      const maskIds = new Int32Array(length).fill(1, 0, ids.length);
      const mask = new Tensor(maskIds, [1, length]);
      shared.push(mask);
      const cross = await this.encode(length, tokenIds, mask);
      shared.push(cross);
      const t1 = performance.now();
      let pending: unknown; // what the last onToken returned: awaited (a promise) before the next step
      let waitedMs = 0;
      const step: core.DecodeStep<RowCache> = async (tokens, index, caches) => {
        if (pending instanceof Promise) {
          const t = performance.now();
          await pending;
          pending = undefined;
          waitedMs += performance.now() - t;
        }
        const live = new Set(caches);
        for (const cache of rowCaches) {
          if (!live.has(cache)) {
            rowCaches.delete(cache);
            cache.delete();
          }
        }
        const logits: Float32Array[] = [];
        const next: RowCache[] = [];
        const position = new Tensor(Int32Array.of(index), [1]);
        try {
          for (let row = 0; row < tokens.length; row++) {
            const token = new Tensor(Int32Array.of(tokens[row]!), [1, 1]);
            let outputs: Record<string, Tensor>;
            try {
              outputs = await this.compiled.run(signature, {
                decoder_token_ids: token,
                cache_update_index: position,
                self_attention_cache: caches[row]!,
                cross_attention_cache: cross,
                encoder_padding_mask: mask,
              });
            } finally {
              token.delete();
            }
            const cache = outputs["self_attention_cache"]!;
            rowCaches.add(cache);
            try {
              logits.push(Float32Array.from(outputs["logits"]!.toTypedArray() as Float32Array));
            } finally {
              for (const [key, tensor] of Object.entries(outputs)) if (key !== "self_attention_cache") tensor.delete();
            }
            next.push(cache);
          }
        } finally {
          position.delete();
        }
        return { logits, caches: next };
      };
      const onStep = options.onToken && ((p: core.DecodeProgress) => {
        pending = options.onToken!({ text: translationText(this.assets.pieces, card, p.tokens), tokens: p.tokens, step: p.step });
      });
      const settings = { bosTokenId: card.bosTokenId, eosTokenId: card.eosTokenId, padTokenId: card.padTokenId,
        maxNewTokens, onStep };
      const empty = new Tensor(new Float32Array(this.cacheShape.reduce((a, b) => a * b, 1)), this.cacheShape);
      rowCaches.add(empty);
      const decoded = beams === 1
        ? await core.greedyDecode(step, empty, settings)
        : await core.beamSearch(step, empty, { ...settings, numBeams: beams,
          lengthPenalty: options.lengthPenalty ?? card.lengthPenalty });
      if (pending instanceof Promise) {
        // The last step's: awaited too, so a rejection (a page stopping an outdated
        // translation) reaches the caller instead of going unhandled.
        const t = performance.now();
        await pending;
        waitedMs += performance.now() - t;
      }
      const all = Array.from(decoded.tokens);
      const end = all.indexOf(card.eosTokenId);
      return {
        text: translationText(this.assets.pieces, card, decoded.tokens),
        tokens: Int32Array.from(end >= 0 ? all.slice(0, end) : all),
        sourceIds: ids,
        sourceLength: length,
        score: decoded.score,
        modelCalls: decoded.modelCalls,
        timing: { encodeMs: t1 - t0, decodeMs: performance.now() - t1 - waitedMs },
      };
    } finally {
      for (const tensor of [...shared, ...rowCaches]) if (!tensor.deleted) tensor.delete();
    }
  }

  /** Frees the compiled model (the object cannot run afterwards). */
  delete(): void {
    this.compiled.delete();
  }

  private signature(template: string, length: number): string {
    return template.replace("{S}", String(length));
  }

  private runner(template: string, length: number) {
    const key = this.signature(template, length);
    const runner = this.compiled.signatures[key];
    if (!runner) {
      throw new core.ModelAssetError(
        `${this.name} has no signature ${key} (signatures: ${Object.keys(this.compiled.signatures).join(", ")}): ` +
          "file and card come from different exports");
    }
    return runner;
  }

  /** The cross-attention cache of a source (a tensor the caller frees). */
  private async encode(length: number, tokenIds: Int32Array, mask: Tensor): Promise<Tensor> {
    const ids = new Tensor(tokenIds, [1, length]);
    let outputs: Record<string, Tensor>;
    try {
      outputs = await this.compiled.run(this.signature(this.card.encodeSignature, length),
        { encoder_token_ids: ids, encoder_padding_mask: mask });
    } finally {
      ids.delete();
    }
    for (const [key, tensor] of Object.entries(outputs)) if (key !== "cross_attention_cache") tensor.delete();
    return outputs["cross_attention_cache"]!;
  }
}
