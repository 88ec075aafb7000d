/**
 * Greedy decoding and beam search of one source around a per-step model callback: the port
 * of `keras_attn/generation.py` (`generate` with the greedy sampler, `_BeamSearch`) as
 * `EncoderDecoderDecoding` calls it (`keras_attn/models/seq2seq_decoding.py`: the prompt is
 * the BOS token alone, a hypothesis stops at EOS, padding after it). Same token rules, same
 * tie rules (the lowest index wins), same early stop; the scores are float32 as in Python.
 *
 * The model is one callback, `step(tokens, index, caches)`: one token per row, written at
 * position `index` of every row's cache (the BOS token at 0), and the rows' opaque caches;
 * it returns each row's next-token logits and new cache. The search reorders the cache
 * objects with the beams (a row may be handed to two beams: the callback must not change a
 * cache in place).
 */
import { argmax } from "./scores";

/** What one model step returns: per row, the next-token logits `(V)` and the new cache. */
export interface StepOutput<C> {
  logits: ArrayLike<number>[];
  caches: C[];
}

/**
 * One model step: `tokens[r]` of row `r` at position `index`, with the cache `caches[r]`.
 * Rows are beams (one row for greedy decoding).
 */
export type DecodeStep<C> = (
  tokens: Int32Array,
  index: number,
  caches: readonly C[],
) => Promise<StepOutput<C>>;

/** Where a decoding stands after each step: the best live hypothesis so far. */
export interface DecodeProgress {
  /** Steps done (tokens chosen so far). */
  step: number;
  /** The generated tokens of the best live hypothesis (greedy: the only one), no BOS. */
  tokens: Int32Array;
}

/** The settings of a decoding (Python's `greedy_decode` / `beam_search` arguments). */
export interface DecodeOptions {
  bosTokenId: number;
  /** The stop token (kept in the output), or `null` for none. */
  eosTokenId: number | null;
  padTokenId: number;
  /** Tokens generated at most (EOS included): the output's length. */
  maxNewTokens: number;
  /** Called after each step. */
  onStep?: (progress: DecodeProgress) => void;
}

/** Options of {@link beamSearch}. */
export interface BeamSearchOptions extends DecodeOptions {
  /** Beam width, >= 1. */
  numBeams: number;
  /** The exponent `lp` of the score `sum log p / L ** lp`. Defaults to 1. */
  lengthPenalty?: number;
}

/** A decoded hypothesis: `maxNewTokens` ids (no BOS; padding after EOS) and its score. */
export interface Decoded {
  tokens: Int32Array;
  /** Beam search: `sum log p / L ** lp` (float32); greedy: `NaN` (not computed). */
  score: number;
  /** Model steps run (rows included: greedy 1 per step, beam search `numBeams`). */
  modelCalls: number;
}

const f32 = Math.fround;

/** `log_softmax` in float32: `x - max - log(sum(exp(x - max)))`. */
export function logSoftmax(logits: ArrayLike<number>): Float32Array {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  const shifted = new Float32Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) {
    shifted[i] = f32(logits[i]! - max);
    sum += Math.exp(shifted[i]!);
  }
  const logSum = f32(Math.log(f32(sum)));
  for (let i = 0; i < shifted.length; i++) shifted[i] = f32(shifted[i]! - logSum);
  return shifted;
}

/**
 * The `k` largest values' indices, largest first, the lower index first among equals
 * (`tf.math.top_k`); `-Infinity` values are ranked too.
 */
export function topKIndices(values: ArrayLike<number>, k: number): number[] {
  const chosen: number[] = [];
  for (let i = 0; i < values.length; i++) {
    const value = values[i]!;
    let at = chosen.length;
    while (at > 0 && values[chosen[at - 1]!]! < value) at--;
    if (at >= k) continue;
    chosen.splice(at, 0, i);
    if (chosen.length > k) chosen.pop();
  }
  return chosen;
}

function checkOptions(options: DecodeOptions): void {
  const { maxNewTokens, bosTokenId, padTokenId, eosTokenId } = options;
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1) {
    throw new RangeError(`maxNewTokens must be an integer >= 1. Received: maxNewTokens=${maxNewTokens}`);
  }
  for (const [name, id] of [["bosTokenId", bosTokenId], ["padTokenId", padTokenId], ["eosTokenId", eosTokenId]] as const) {
    if (id !== null && (!Number.isInteger(id) || id < 0)) {
      throw new RangeError(`${name} must be a token id (an integer >= 0). Received: ${name}=${id}`);
    }
  }
}

/**
 * Greedy decoding of one source, `y_t = argmax_v z_t[v]` (Python `greedy_decode`):
 * stops after EOS or `maxNewTokens` tokens.
 *
 * Example (a model where token v is followed by v + 1, as generation.py's doctest):
 * ```ts
 * const step: DecodeStep<null> = async (tokens) => ({
 *   logits: [...tokens].map((t) => [0, 1, 2, 3].map((v) => (v === (t + 1) % 4 ? 1 : 0))),
 *   caches: [...tokens].map(() => null) });
 * (await greedyDecode(step, null, { bosTokenId: 0, eosTokenId: 3, padTokenId: 0, maxNewTokens: 4 })).tokens;
 * // Int32Array [1, 2, 3, 0]
 * ```
 */
export async function greedyDecode<C>(step: DecodeStep<C>, cache: C, options: DecodeOptions): Promise<Decoded> {
  checkOptions(options);
  const { bosTokenId, eosTokenId, padTokenId, maxNewTokens } = options;
  const tokens = new Int32Array(maxNewTokens).fill(padTokenId);
  let last = bosTokenId;
  let modelCalls = 0;
  for (let index = 0; index < maxNewTokens; index++) {
    const out = await step(Int32Array.of(last), index, [cache]);
    modelCalls += 1;
    cache = out.caches[0]!;
    last = argmax(out.logits[0]!); // the first on ties, as TensorFlow's
    tokens[index] = last;
    options.onStep?.({ step: index + 1, tokens: tokens.slice(0, index + 1) });
    if (last === eosTokenId) break;
  }
  return { tokens, score: NaN, modelCalls };
}

/**
 * Beam search of one source (Python `beam_search`, batch 1): the hypothesis of the best
 * `sum_t log p(y_t) / L ** lengthPenalty`, `L` its tokens (EOS included).
 *
 * Each step extends each of the `numBeams` live hypotheses by every token (candidates
 * beam-major, `beam * V + token`), sends every extension ending in EOS (every one at the
 * last step) to the finished set, whose best is replaced only by a strictly better score,
 * and keeps the `numBeams` best others (the lower candidate index first among equals). At
 * first only beam 0 is live. The search stops early once no live hypothesis can beat the
 * best finished one (log-probabilities are <= 0), which gives the result of running every
 * step.
 */
export async function beamSearch<C>(step: DecodeStep<C>, cache: C, options: BeamSearchOptions): Promise<Decoded> {
  checkOptions(options);
  const { bosTokenId, eosTokenId, padTokenId, maxNewTokens, numBeams } = options;
  const lengthPenalty = options.lengthPenalty ?? 1;
  if (!Number.isInteger(numBeams) || numBeams < 1) {
    throw new RangeError(`numBeams must be an integer >= 1. Received: numBeams=${numBeams}`);
  }
  if (!Number.isFinite(lengthPenalty)) {
    throw new RangeError(`lengthPenalty must be a finite number. Received: lengthPenalty=${lengthPenalty}`);
  }
  const normalizer = (length: number) => f32(Math.pow(length, lengthPenalty));
  const first = await step(Int32Array.of(bosTokenId), 0, [cache]);
  let modelCalls = 1;
  const vocab = first.logits[0]!.length;
  const firstLogProbs = logSoftmax(first.logits[0]!);
  let logProbs: Float32Array[] = Array.from({ length: numBeams }, () => firstLogProbs);
  let caches: C[] = Array.from({ length: numBeams }, () => first.caches[0]!);
  let beams: Int32Array[] = Array.from({ length: numBeams }, () => new Int32Array(maxNewTokens).fill(padTokenId));
  let beamScores = Float32Array.from({ length: numBeams }, (_, k) => (k === 0 ? 0 : -Infinity));
  let bestScore = -Infinity;
  let bestTokens = new Int32Array(maxNewTokens).fill(padTokenId);
  const candidates = new Float32Array(numBeams * vocab);

  /** Extends every beam by every token at `column`; updates the best finished and the beams. */
  const select = (column: number): void => {
    const last = column === maxNewTokens - 1;
    const norm = normalizer(column + 1);
    let bestCandidate = -1;
    let candidateScore = -Infinity;
    for (let k = 0; k < numBeams; k++) {
      for (let v = 0; v < vocab; v++) {
        const i = k * vocab + v;
        const score = f32(beamScores[k]! + logProbs[k]![v]!);
        if (last || v === eosTokenId) {
          const finished = f32(score / norm);
          if (finished > candidateScore) [bestCandidate, candidateScore] = [i, finished];
          candidates[i] = -Infinity;
        } else {
          candidates[i] = score;
        }
      }
    }
    // Strictly better only: a later equal score never replaces an earlier one (which makes
    // the early stop exact).
    if (bestCandidate >= 0 && candidateScore > bestScore) {
      bestTokens = beams[Math.floor(bestCandidate / vocab)]!.slice();
      bestTokens[column] = bestCandidate % vocab;
      bestScore = candidateScore;
    }
    const chosen = topKIndices(candidates, numBeams);
    beams = chosen.map((i) => {
      const tokens = beams[Math.floor(i / vocab)]!.slice();
      tokens[column] = i % vocab;
      return tokens;
    });
    caches = chosen.map((i) => caches[Math.floor(i / vocab)]!);
    beamScores = Float32Array.from(chosen, (i) => candidates[i]!);
  };

  /** Whether a live beam can still beat the best finished one after `column`. */
  const continues = (column: number): boolean => {
    if (column >= maxNewTokens - 1) return false;
    const finalLength = lengthPenalty >= 0 ? maxNewTokens : column + 1;
    let top = -Infinity;
    for (const score of beamScores) if (score > top) top = score;
    return !(bestScore >= f32(top / normalizer(finalLength)));
  };

  let column = 0;
  for (; continues(column); column++) {
    select(column);
    options.onStep?.({ step: column + 1, tokens: beams[0]!.slice(0, column + 1) });
    const out = await step(Int32Array.from(beams, (tokens) => tokens[column]!), column + 1, caches);
    modelCalls += numBeams;
    caches = out.caches;
    logProbs = out.logits.map(logSoftmax);
  }
  // The last selection finishes every live beam (after an early stop, none can beat the best).
  select(column);
  options.onStep?.({ step: column + 1, tokens: bestTokens.slice(0, column + 1) });
  return { tokens: bestTokens, score: bestScore, modelCalls };
}
