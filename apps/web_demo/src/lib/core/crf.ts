import { argmax } from "./scores";

/**
 * The arithmetic of a Viterbi decode: `"float64"` (the golden vectors' `viterbi_float64`
 * and the Kotlin core) or `"float32"` (`keras_attn.layers.crf.viterbi_decode`, what
 * `keras-attn predict` runs on a `.tflite` tagger's float32 logits; every score and every sum
 * is rounded to float32 with `Math.fround`, which is exact: a double sum of two floats rounds
 * to the same float as a float32 addition).
 */
export type Precision = "float64" | "float32";

/**
 * The transition scores of a linear-chain CRF tagger (the model card's `crf` entry) and its
 * Viterbi decoder (the Kotlin core's `CrfTransitions`):
 *
 *     delta_1 = start + E_1,   delta_i[j] = max_k(delta_{i-1}[k] + A[k][j]) + E_i[j]
 *     y_n = argmax_j(delta_n[j] + end[j]),   y_{i-1} = backpointer_i[y_i]
 *
 * The additions happen in the order of the Python references
 * (`keras_attn.export.golden_vectors.viterbi_float64`, `keras_attn.layers.crf.viterbi_decode`),
 * so the same numbers in give the same path out, ties included (the lowest tag index wins).
 *
 * Example:
 * ```ts
 * const crf = new CrfTransitions([[-5, 0], [0, 0]], [0, 0], [0, 0]);  // tag 0 never follows tag 0
 * crf.viterbi([[2, 0], [1, 0]]);  // [0, 1]
 * ```
 */
export class CrfTransitions {
  readonly numTags: number;

  /**
   * @param transitions `A[i][j]`, the score of tag `i` followed by tag `j`, `(K, K)`.
   * @param start scores of the first tag, `(K,)`.
   * @param end scores of the last tag, `(K,)`.
   * @throws RangeError when the shapes disagree.
   */
  constructor(
    readonly transitions: readonly (readonly number[])[],
    readonly start: readonly number[],
    readonly end: readonly number[],
  ) {
    this.numTags = start.length;
    const k = this.numTags;
    if (k === 0 || end.length !== k || transitions.length !== k || transitions.some((row) => row.length !== k)) {
      throw new RangeError(
        `CRF weights must be transitions (K, K), start and end (K,); got ${transitions.length} rows, ` +
          `${start.length} start and ${end.length} end scores`,
      );
    }
  }

  /**
   * The highest-scoring tag path of `emissions` (`[position][tag]`, real positions only).
   *
   * @param precision the arithmetic (see {@link Precision}); `"float64"` by default.
   * @returns one tag index per position (empty for no positions).
   */
  viterbi(emissions: readonly ArrayLike<number>[], precision: Precision = "float64"): number[] {
    const n = emissions.length;
    if (n === 0) return [];
    for (const [i, row] of emissions.entries()) {
      if (row.length !== this.numTags) {
        throw new RangeError(`emissions[${i}] has ${row.length} scores, the CRF has ${this.numTags} tags`);
      }
    }
    const r = precision === "float32" ? Math.fround : (x: number) => x;
    const add = (a: number, b: number) => r(r(a) + r(b));
    let delta = this.start.map((s, j) => add(s, emissions[0]![j]!));
    const backpointers: number[][] = [];
    for (let i = 1; i < n; i++) {
      const [best, backpointer] = this.step(delta, add);
      backpointers.push(backpointer);
      delta = best.map((score, j) => add(score, emissions[i]![j]!));
    }
    const path = [argmax(delta.map((score, j) => add(score, this.end[j]!)))];
    for (let i = n - 2; i >= 0; i--) path.push(backpointers[i]![path[path.length - 1]!]!);
    return path.reverse();
  }

  /** Total score of one path (`s(y)` above, float64), for tests and debugging. */
  pathScore(emissions: readonly ArrayLike<number>[], path: readonly number[]): number {
    if (path.length === 0) return 0;
    let score = this.start[path[0]!]! + emissions[0]![path[0]!]!;
    for (let i = 1; i < path.length; i++) {
      score += this.transitions[path[i - 1]!]![path[i]!]! + emissions[i]![path[i]!]!;
    }
    return score + this.end[path[path.length - 1]!]!;
  }

  /** `max_k(delta[k] + A[k][j])` and its first `k`, for each tag `j`. */
  private step(delta: readonly number[], add: (a: number, b: number) => number): [number[], number[]] {
    const best: number[] = [];
    const backpointer: number[] = [];
    for (let j = 0; j < this.numTags; j++) {
      let bestK = 0;
      let bestScore = add(delta[0]!, this.transitions[0]![j]!);
      for (let k = 1; k < this.numTags; k++) {
        const candidate = add(delta[k]!, this.transitions[k]![j]!);
        if (candidate > bestScore) {
          bestScore = candidate;
          bestK = k;
        }
      }
      best.push(bestScore);
      backpointer.push(bestK);
    }
    return [best, backpointer];
  }
}
