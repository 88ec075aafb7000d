/**
 * Greedy decoding and beam search (src/lib/core/decoding.ts) against hand-computed answers
 * on tiny log-probability tables (as `keras_attn/generation.py`'s doctests), the tie rules of
 * Python's search, and an exhaustive search on random tables where the model's logits depend
 * on the whole prefix held in the cache (so a cache not reordered with its beam gives other
 * answers).
 */
import { describe, expect, test } from "vitest";

import { beamSearch, type DecodeStep, greedyDecode, logSoftmax, topKIndices } from "../src/lib/core/decoding";

/** A model whose next-token logits depend on the last token only: `table[last]`. */
function tableModel(table: number[][]): { step: DecodeStep<null>; calls: number[] } {
  const calls: number[] = [];
  const step: DecodeStep<null> = async (tokens, index) => {
    calls.push(index);
    return { logits: Array.from(tokens, (t) => table[t]!), caches: Array.from(tokens, () => null) };
  };
  return { step, calls };
}

const log = Math.log;
// generation.py's doctest: row v holds p(next | last token v).
const DOCTEST = [[0.1, 0.5, 0.4], [0.4, 0.3, 0.3], [0.05, 0.9, 0.05]].map((row) => row.map(log));
const settings = { bosTokenId: 0, eosTokenId: null, padTokenId: 0 };

describe("greedy decoding", () => {
  test("follows the argmax and stops after EOS, padding the rest", async () => {
    // next(v) = v + 1 (generation.py's `generate` doctest): 0 -> 1 -> 2 -> 3 (EOS).
    const table = [0, 1, 2, 3].map((v) => [0, 1, 2, 3].map((u) => (u === (v + 1) % 4 ? 1 : 0)));
    const model = tableModel(table);
    const out = await greedyDecode(model.step, null, { ...settings, eosTokenId: 3, maxNewTokens: 5 });
    expect(Array.from(out.tokens)).toEqual([1, 2, 3, 0, 0]);
    expect(model.calls).toEqual([0, 1, 2]); // BOS at 0, then each token at its position
  });

  test("takes the lower token on a tie, and runs maxNewTokens steps without EOS", async () => {
    const model = tableModel([[-1, 2, 2], [5, 0, 5], [0, 0, 0]]);
    const progress: number[][] = [];
    const out = await greedyDecode(model.step, null, {
      ...settings, maxNewTokens: 3, onStep: (p) => progress.push(Array.from(p.tokens)) });
    expect(Array.from(out.tokens)).toEqual([1, 0, 1]);
    expect(progress).toEqual([[1], [1, 0], [1, 0, 1]]);
  });
});

describe("beam search", () => {
  test("finds the doctest's best pair where greedy does not", async () => {
    const greedy = await greedyDecode(tableModel(DOCTEST).step, null, { ...settings, maxNewTokens: 2 });
    expect(Array.from(greedy.tokens)).toEqual([1, 0]); // 0.5 * 0.4 = 0.2
    const out = await beamSearch(tableModel(DOCTEST).step, null, {
      ...settings, maxNewTokens: 2, numBeams: 2, lengthPenalty: 0 });
    expect(Array.from(out.tokens)).toEqual([2, 1]); // 0.4 * 0.9 = 0.36
    expect(out.score).toBeCloseTo(log(0.36), 5); // -1.0217
  });

  // Tokens: 0 BOS/pad, 1 a word, 2 EOS. After BOS: "a" or EOS at 1/2 each; after "a": EOS
  // with probability 1 (log 0 exactly). So [EOS] and [a, EOS] have the same log-probability.
  const EQUAL = [[-Infinity, 0, 0], [-Infinity, -Infinity, 0], [0, 0, 0]];
  const eos = { ...settings, eosTokenId: 2, maxNewTokens: 3, numBeams: 2 };

  test("an equal later score does not replace the best, and the search stops at the bound", async () => {
    const model = tableModel(EQUAL);
    const out = await beamSearch(model.step, null, { ...eos, lengthPenalty: 0 });
    expect(Array.from(out.tokens)).toEqual([2, 0, 0]); // the first found, not [1, 2, 0]
    expect(out.score).toBe(Math.fround(log(0.5)));
    // After step 0 no live beam can beat log(1/2): one more step (of 2 rows), then stop.
    expect(model.calls).toEqual([0, 1]);
    expect(out.modelCalls).toBe(3);
  });

  test("the length penalty divides by L ** lp", async () => {
    const out = await beamSearch(tableModel(EQUAL).step, null, { ...eos, lengthPenalty: 1 });
    expect(Array.from(out.tokens)).toEqual([1, 2, 0]); // log(1/2) / 2 beats log(1/2) / 1
    expect(out.score).toBe(Math.fround(Math.fround(log(0.5)) / 2));
  });

  test("equal candidates are kept lower index first (beam-major), and the first finished wins", async () => {
    // After BOS, tokens 1 and 2 tie; from either, EOS (3) comes with the same probability.
    const row = [-Infinity, log(0.25), log(0.25), log(0.5)];
    const table = [[-Infinity, 0, 0, -Infinity], row, row, row];
    const progress: number[][] = [];
    const out = await beamSearch(tableModel(table).step, null, {
      ...settings, eosTokenId: 3, maxNewTokens: 2, numBeams: 2, lengthPenalty: 0,
      onStep: (p) => progress.push(Array.from(p.tokens)) });
    expect(progress[0]).toEqual([1]); // beam 0 holds the lower of the tied tokens
    expect(Array.from(out.tokens)).toEqual([1, 3]); // not [2, 3], its equal
  });

  test("one beam is greedy decoding", async () => {
    const table = [[0.1, 2, 2, -1], [0.5, 0.2, 3, 1], [4, 4, 0, 0], [0, 1, 2, 3]];
    const greedy = await greedyDecode(tableModel(table).step, null, { ...settings, eosTokenId: 3, maxNewTokens: 6 });
    const beam = await beamSearch(tableModel(table).step, null, {
      ...settings, eosTokenId: 3, maxNewTokens: 6, numBeams: 1 });
    expect(Array.from(greedy.tokens)).toEqual([1, 2, 0, 1, 2, 0]);
    expect(Array.from(beam.tokens)).toEqual(Array.from(greedy.tokens));
  });

  test("with V ** (N - 1) beams it is exhaustive, with caches reordered with the beams", async () => {
    const V = 4, EOS = 3, N = 4;
    let seed = 7;
    const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const logits = new Map<string, number[]>();
    /** Logits after a prefix (BOS included), drawn once per prefix. */
    const logitsOf = (prefix: number[]) => {
      const key = prefix.join(",");
      if (!logits.has(key)) logits.set(key, Array.from({ length: V }, () => 4 * random()));
      return logits.get(key)!;
    };
    // The cache of a row is its prefix: the logits depend on all of it.
    const step: DecodeStep<number[]> = async (tokens, index, caches) => {
      const next = caches.map((prefix, r) => {
        expect(prefix.length).toBe(index);
        return [...prefix, tokens[r]!];
      });
      return { logits: next.map(logitsOf), caches: next };
    };
    for (const lengthPenalty of [0, 0.6, 1, 2]) {
      for (let trial = 0; trial < 10; trial++) {
        logits.clear();
        const out = await beamSearch(step, [], {
          bosTokenId: 0, eosTokenId: EOS, padTokenId: 0, maxNewTokens: N, numBeams: V ** (N - 1), lengthPenalty });
        // Every hypothesis: up to EOS, or N tokens; float64 scores.
        let best = { score: -Infinity, tokens: [] as number[] };
        const visit = (tokens: number[], sum: number) => {
          const lp = Array.from(logSoftmax(logitsOf([0, ...tokens])));
          for (let v = 0; v < V; v++) {
            const next = [...tokens, v];
            if (v === EOS || next.length === N) {
              const score = (sum + lp[v]!) / next.length ** lengthPenalty;
              if (score > best.score) best = { score, tokens: next };
            } else visit(next, sum + lp[v]!);
          }
        };
        visit([], 0);
        const expected = [...best.tokens, ...Array(N - best.tokens.length).fill(0)];
        expect(Array.from(out.tokens), `lp=${lengthPenalty} trial ${trial}`).toEqual(expected);
        expect(out.score).toBeCloseTo(best.score, 5);
      }
    }
  });

  test("bad settings get clear errors", async () => {
    const { step } = tableModel(DOCTEST);
    await expect(beamSearch(step, null, { ...settings, maxNewTokens: 2, numBeams: 0 }))
      .rejects.toThrow("Received: numBeams=0");
    await expect(greedyDecode(step, null, { ...settings, maxNewTokens: 0 }))
      .rejects.toThrow("Received: maxNewTokens=0");
  });
});

describe("helpers", () => {
  test("top-k keeps the lower index first among equals, -Infinity included", () => {
    expect(topKIndices([1, 3, 3, 2, 3], 2)).toEqual([1, 2]);
    expect(topKIndices([-Infinity, 0, -Infinity, -Infinity], 3)).toEqual([1, 0, 2]);
  });

  test("log-softmax is float32 log-probabilities", () => {
    const lp = logSoftmax([0, Math.log(3)]);
    expect(lp).toBeInstanceOf(Float32Array);
    expect(lp[0]).toBeCloseTo(Math.log(0.25), 6);
    expect(lp[1]).toBeCloseTo(Math.log(0.75), 6);
    expect(Array.from(logSoftmax([-Infinity, 0]))).toEqual([-Infinity, 0]);
  });
});
