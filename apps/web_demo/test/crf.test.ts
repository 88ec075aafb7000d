/** Viterbi against brute force over all paths, and hand-checked examples (Kotlin `CrfTest`). */
import { describe, expect, test } from "vitest";

import { CrfTransitions } from "../src/lib/core";

/** Seeded uniform [0, 1) (mulberry32), integer and standard normal (Box-Muller) numbers. */
function random(seed: number) {
  let state = seed >>> 0;
  const uniform = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    integer: (bound: number) => Math.floor(uniform() * bound),
    gaussian: () => Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform()),
  };
}

function bruteForce(crf: CrfTransitions, emissions: number[][]): number[] {
  const n = emissions.length;
  const k = crf.numTags;
  let best: number[] = [];
  let bestScore = -Infinity;
  for (let code = 0; code < k ** n; code++) {
    const path = Array.from({ length: n }, (_, i) => Math.floor(code / k ** (n - 1 - i)) % k);
    const score = crf.pathScore(emissions, path);
    if (score > bestScore) [best, bestScore] = [path, score];
  }
  return best;
}

describe("CrfTransitions", () => {
  test("Viterbi finds the best path of random cases", () => {
    const { integer, gaussian } = random(7);
    const normal = (size: number) => Array.from({ length: size }, () => gaussian() * 2);
    for (let trial = 0; trial < 300; trial++) {
      const k = 1 + integer(4);
      const n = 1 + integer(5);
      const crf = new CrfTransitions(Array.from({ length: k }, () => normal(k)), normal(k), normal(k));
      const emissions = Array.from({ length: n }, () => normal(k));
      const path = crf.viterbi(emissions);
      const expected = bruteForce(crf, emissions);
      expect(crf.pathScore(emissions, path), `case ${trial}`).toBeCloseTo(crf.pathScore(emissions, expected), 9);
      expect(path, `case ${trial}`).toEqual(expected);
    }
  });

  test("transitions override emissions and ties go to the lowest tag", () => {
    // Tag 0 never follows tag 0 (the docstring example of keras_attn.layers.crf).
    const crf = new CrfTransitions([[-5, 0], [0, 0]], [0, 0], [0, 0]);
    expect(crf.viterbi([[2, 0], [1, 0]])).toEqual([0, 1]);
    const flat = new CrfTransitions([[0, 0, 0], [0, 0, 0], [0, 0, 0]], [0, 0, 0], [0, 0, 0]);
    expect(flat.viterbi([[0, 0, 0], [0, 0, 0]])).toEqual([0, 0]);
    expect(flat.viterbi([])).toEqual([]);
  });

  test("float32 arithmetic rounds every sum as keras_attn.layers.crf.viterbi_decode does", () => {
    // Expected paths computed in Python: viterbi_decode (float32) and viterbi_float64.
    const big = 2 ** 24; // float32 spacing is 2 here
    const single = new CrfTransitions([[0, 0], [0, 0]], [big, big], [0, 0]);
    expect(single.viterbi([[0, 1]], "float32")).toEqual([0]); // 2^24 + 1 rounds to 2^24: a tie
    expect(single.viterbi([[0, 1]], "float64")).toEqual([1]);
    const step = new CrfTransitions([[0, 1.5], [0, 0]], [big, big + 2], [0, 1]);
    expect(step.viterbi([[0, 0], [0, 0]], "float32")).toEqual([0, 1]); // 2^24 + 1.5 ties 2^24 + 2
    expect(step.viterbi([[0, 0], [0, 0]], "float64")).toEqual([1, 1]);
  });

  test("mismatched shapes are rejected", () => {
    expect(() => new CrfTransitions([[0, 0, 0], [0, 0, 0]], [0, 0], [0, 0])).toThrow(RangeError);
    expect(() => new CrfTransitions([[0]], [0], [0]).viterbi([[0, 1]])).toThrow("emissions[0] has 2 scores, the CRF has 1 tags");
  });
});
