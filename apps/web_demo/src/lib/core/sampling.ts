/**
 * Greedy decoding and sampling of a causal language model around a per-token model callback:
 * the port of `keras_attn.generation.generate` (and its logit processors) as Python's
 * `TextGenerator.generate_ids` runs it on a `GenerationFile`.
 *
 * - greedy: `y_t = argmax_v z_t[v]` (the first index on ties, as TensorFlow's): the same ids
 *   as Python wherever the logits are the same;
 * - sampling: temperature, then top-k, then top-p (HF's order; ties with the last kept logit
 *   are kept), then a draw by inverting the CDF at one uniform per step, in float32 as
 *   Python. Python draws its uniforms from TensorFlow's RNG, which JavaScript cannot
 *   reproduce: here they come from {@link seededUniforms} (a 32-bit PRNG, mulberry32), so a
 *   seed repeats its text in the browser but it is not Python's text for that seed.
 *
 * Example (a model where token v is followed by v + 1):
 * ```ts
 * const step = async (token: number) => [0, 1, 2, 3].map((v) => (v === (token + 1) % 4 ? 1 : 0));
 * (await generateTokens(step, Int32Array.of(0), { maxNewTokens: 3 })).ids;  // Int32Array [1, 2, 3]
 * ```
 */
import { argmax } from "./scores";

/** How the next token is chosen (Python `generate`'s sampling arguments). */
export interface SamplingOptions {
  /** `"greedy"` (default) or `"sample"`. */
  sampler?: "greedy" | "sample";
  /** Sampling only: logits are divided by it, > 0. Default 1. */
  temperature?: number;
  /** Sampling only: keep the `topK` largest logits (ties kept), an integer >= 1. */
  topK?: number | null;
  /** Sampling only: keep the smallest most likely set of mass >= `topP`, in (0, 1]. */
  topP?: number | null;
  /**
   * Sampling only: the seed of the uniforms (a safe integer); the same seed gives the same
   * tokens. Default: a random one (the result says which).
   */
  seed?: number | null;
}

/** The settings of one generation (Python `generate_ids`' arguments). */
export interface GenerateTokensOptions extends SamplingOptions {
  /** Tokens generated at most (a stop token included). */
  maxNewTokens: number;
  /** Ids that end the generation (kept out of `ids`). */
  stopTokenIds?: readonly number[];
  /** Called with each token chosen (stop tokens too) before the next step; a returned promise is awaited. */
  onToken?: (token: number, step: number) => unknown;
}

/** What {@link generateTokens} returns. */
export interface GeneratedTokens {
  /** The new ids, up to the first stop token (excluded). */
  ids: Int32Array;
  /** Whether a stop token ended it. */
  stopped: boolean;
  /** The seed of the uniforms (sampling), or null (greedy). */
  seed: number | null;
  /** Model calls: one per prompt token, then one per new token but the last. */
  modelCalls: number;
  /** Milliseconds in the model callbacks for the prompt, and for the new tokens. */
  promptMs: number;
  generateMs: number;
  /** Milliseconds spent waiting for `onToken`'s promises (not in the above). */
  waitedMs: number;
}

/** One model call: the logits `(V)` of the token after `token` at position `index`. */
export type TokenStep = (token: number, index: number) => Promise<ArrayLike<number>>;

const f32 = Math.fround;

/**
 * Checks the sampling settings as Python's `_check_sampler`: a known sampler; for greedy
 * decoding no sampling argument (it would have no effect); for sampling valid ones.
 *
 * @throws RangeError naming the setting.
 */
export function checkSampling(options: SamplingOptions): void {
  const sampler = options.sampler ?? "greedy";
  if (sampler !== "greedy" && sampler !== "sample") {
    throw new RangeError(`sampler must be "greedy" or "sample". Received: sampler=${JSON.stringify(sampler)}`);
  }
  const { temperature, topK, topP, seed } = options;
  if (sampler === "greedy") {
    const given = Object.entries({ temperature: temperature === 1 ? undefined : temperature, topK, topP })
      .filter(([, value]) => value !== undefined && value !== null);
    if (given.length) {
      throw new RangeError(
        "temperature, topK and topP shape the sampling distribution and have no effect on greedy " +
          `decoding; pass sampler: "sample" or drop them. Received: sampler="greedy", ` +
          given.map(([name, value]) => `${name}=${value}`).join(", "));
    }
    return;
  }
  if (temperature !== undefined && !(typeof temperature === "number" && temperature > 0 && Number.isFinite(temperature))) {
    throw new RangeError(`temperature must be a number > 0 (logits are divided by it). Received: temperature=${temperature}`);
  }
  if (topK !== undefined && topK !== null && !(Number.isInteger(topK) && topK >= 1)) {
    throw new RangeError(`topK must be an integer >= 1. Received: topK=${topK}`);
  }
  if (topP !== undefined && topP !== null && !(typeof topP === "number" && topP > 0 && topP <= 1)) {
    throw new RangeError(`topP must be a number in (0, 1] (a probability mass). Received: topP=${topP}`);
  }
  if (seed !== undefined && seed !== null && !Number.isSafeInteger(seed)) {
    throw new RangeError(`seed must be an integer. Received: seed=${seed}`);
  }
}

/** `logits / temperature` in float32 (Python `scale_by_temperature`). */
export function scaleByTemperature(logits: ArrayLike<number>, temperature: number): Float32Array {
  const t = f32(temperature);
  return Float32Array.from(logits, (z) => f32(z / t));
}

/** Keeps the `k` largest logits (and ties with the k-th), the others `-Infinity` (Python `top_k_filter`). */
export function topKFilter(logits: ArrayLike<number>, k: number): Float32Array {
  const sorted = Float32Array.from(logits).sort().reverse(); // descending
  const kth = sorted[Math.min(k, sorted.length) - 1]!;
  return Float32Array.from(logits, (z) => (z < kth ? -Infinity : z));
}

/**
 * Nucleus filter (Python `top_p_filter`): sorted by decreasing probability, token j is kept
 * when the mass before it is `< p` (the most likely always); ties with the last kept logit kept.
 */
export function topPFilter(logits: ArrayLike<number>, p: number): Float32Array {
  const descending = Float32Array.from(logits).sort().reverse();
  const probs = softmax32(descending);
  let kept = 0;
  let before = 0;
  for (let j = 0; j < probs.length; j++) {
    if (f32(before) < p) kept += 1;
    before = f32(before + probs[j]!);
  }
  const threshold = descending[Math.max(kept, 1) - 1]!;
  return Float32Array.from(logits, (z) => (z < threshold ? -Infinity : z));
}

/** Temperature, then top-k, then top-p (Python `process_logits`). */
export function processLogits(logits: ArrayLike<number>, options: SamplingOptions = {}): Float32Array {
  let out: Float32Array = Float32Array.from(logits);
  if (options.temperature !== undefined && options.temperature !== 1) out = scaleByTemperature(out, options.temperature);
  if (options.topK !== undefined && options.topK !== null) out = topKFilter(out, options.topK);
  if (options.topP !== undefined && options.topP !== null) out = topPFilter(out, options.topP);
  return out;
}

/** `softmax` in float32 (`-Infinity` logits get probability 0). */
export function softmax32(logits: ArrayLike<number>): Float32Array {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  const out = new Float32Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) {
    out[i] = Math.exp(logits[i]! - max);
    sum += out[i]!;
  }
  for (let i = 0; i < out.length; i++) out[i] = f32(out[i]! / sum);
  return out;
}

/**
 * The token drawn from `softmax(logits)` by inverting its CDF at `uniform` in [0, 1)
 * (Python `sample_from_logits`): token j when `cdf[j-1] <= u * cdf[V-1] < cdf[j]`, so a
 * token of probability 0 (logit `-Infinity`) is never drawn.
 */
export function sampleFromLogits(logits: ArrayLike<number>, uniform: number): number {
  const probs = softmax32(logits);
  const cdf = new Float32Array(probs.length);
  let total = 0;
  for (let i = 0; i < probs.length; i++) cdf[i] = total = f32(total + probs[i]!);
  const target = f32(f32(uniform) * total);
  let index = 0;
  for (let i = 0; i < cdf.length; i++) if (cdf[i]! <= target) index += 1;
  let lastPossible = probs.length - 1;
  while (lastPossible > 0 && !(probs[lastPossible]! > 0)) lastPossible -= 1;
  return Math.min(index, lastPossible);
}

/**
 * `count` uniforms in [0, 1) from `seed` (mulberry32 on a 32-bit state mixed from the seed's
 * two halves): the i-th does not depend on `count`, so a seed gives the same first tokens for
 * any `maxNewTokens`.
 */
export function seededUniforms(seed: number, count: number): Float64Array {
  let state = ((seed >>> 0) ^ Math.imul(Math.floor(seed / 4294967296) >>> 0, 0x9e3779b9)) >>> 0;
  const out = new Float64Array(count);
  for (let i = 0; i < count; i++) {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  return out;
}

/** A random seed (when sampling without one), in [0, 2^32). */
export function randomSeed(): number {
  const crypto = (globalThis as { crypto?: Crypto }).crypto;
  if (crypto?.getRandomValues) return crypto.getRandomValues(new Uint32Array(1))[0]!;
  return Math.floor(Math.random() * 4294967296);
}

/**
 * Generates up to `maxNewTokens` tokens after `prompt` (Python `generate` + `generate_ids`
 * for one row): the prompt runs through `step` one token at a time, then each chosen token;
 * stops after a stop token.
 *
 * @throws RangeError for bad settings (see {@link checkSampling}) or an empty prompt.
 */
export async function generateTokens(step: TokenStep, prompt: ArrayLike<number>,
  options: GenerateTokensOptions): Promise<GeneratedTokens> {
  checkSampling(options);
  const { maxNewTokens } = options;
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1) {
    throw new RangeError(`maxNewTokens must be an integer >= 1. Received: maxNewTokens=${maxNewTokens}`);
  }
  if (prompt.length < 1) throw new RangeError("the prompt holds no token: give at least one");
  const sample = (options.sampler ?? "greedy") === "sample";
  const seed = sample ? (options.seed ?? randomSeed()) : null;
  const uniforms = seed === null ? null : seededUniforms(seed, maxNewTokens);
  const stops = options.stopTokenIds ?? [];
  const choose = (logits: ArrayLike<number>, i: number) =>
    uniforms === null ? argmax(logits) : sampleFromLogits(processLogits(logits, options), uniforms[i]!);

  let modelCalls = 0;
  let waitedMs = 0;
  const t0 = performance.now();
  let logits: ArrayLike<number> = [];
  for (let index = 0; index < prompt.length; index++) {
    logits = await step(prompt[index]!, index);
    modelCalls += 1;
  }
  const promptMs = performance.now() - t0;
  const ids: number[] = [];
  let stopped = false;
  let generateMs = 0;
  for (let i = 0; i < maxNewTokens; i++) {
    const t = performance.now();
    if (i > 0) {
      logits = await step(ids[i - 1]!, prompt.length + i - 1);
      modelCalls += 1;
    }
    const token = choose(logits, i);
    generateMs += performance.now() - t;
    const pending = options.onToken?.(token, i);
    if (pending instanceof Promise) {
      const w = performance.now();
      await pending;
      waitedMs += performance.now() - w;
    }
    if (stops.includes(token)) {
      stopped = true;
      break;
    }
    ids.push(token);
  }
  return { ids: Int32Array.from(ids), stopped, seed, modelCalls, promptMs, generateMs, waitedMs };
}
