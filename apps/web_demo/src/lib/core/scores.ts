/**
 * Scores to decisions: argmax, softmax and top-k, in double precision (the Kotlin core's
 * `Scores`). Float32 model outputs (`Float32Array`) are read as the doubles they hold, as
 * numpy's `np.asarray(logits, "float64")` does.
 *
 * Example:
 * ```ts
 * softmax([0, 0]);          // [0.5, 0.5]
 * topK([0.1, 0.7, 0.2], 2);  // [1, 2]
 * ```
 */

/**
 * Index of the largest value; the first one on ties, and the first NaN if any, as numpy's
 * `argmax`.
 */
export function argmax(values: ArrayLike<number>): number {
  if (values.length === 0) throw new RangeError("argmax of an empty array");
  let best = 0;
  for (let i = 0; i < values.length; i++) {
    if (Number.isNaN(values[i])) return i;
    if (values[i]! > values[best]!) best = i;
  }
  return best;
}

/**
 * `exp(x - max(x)) / sum(exp(x - max(x)))`, the probabilities of logits `x` (stable for large
 * logits), in float64. Equal to numpy's to the last bit or two: `Math.exp` and numpy's `exp`
 * are both faithful, not always correctly rounded.
 */
export function softmax(logits: ArrayLike<number>): number[] {
  const top = logits[argmax(logits)]!;
  const result = Array.from(logits, (x) => Math.exp(x - top));
  let sum = 0;
  for (const value of result) sum += value;
  return result.map((value) => value / sum);
}

/** Indices of the `k` largest values, largest first (lower index first on ties). */
export function topK(values: ArrayLike<number>, k: number): number[] {
  if (!Number.isInteger(k) || k < 0) throw new RangeError(`k must be an integer >= 0, got ${k}`);
  const order = Array.from(values, (_, i) => i);
  order.sort((a, b) => (values[b]! > values[a]! ? 1 : values[b]! < values[a]! ? -1 : a - b));
  return order.slice(0, Math.min(k, values.length));
}
