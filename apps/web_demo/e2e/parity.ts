/**
 * The int8 parity rules between Python LiteRT and the page, as one pure function: the browser
 * test (e2e/app.spec.ts) applies it to the page's outputs, the unit test
 * (test/parity.test.ts) to recorded and mutated ones, and `benchmarks/web_accuracy.py` applies
 * the same rules, with the same numbers (e2e/parity_rules.json), to whole evaluation sets.
 *
 * An int8 file keeps attention, GELU and LayerNorm in float; the browser's WebAssembly SIMD
 * kernels round those differently from the native ones, so a value at a rounding boundary of
 * a later requantization can land one int8 step away. What must hold, all decided before the
 * page's outputs are seen:
 *
 * 1. at least `min_bit_identical` of the texts get bit-identical logits;
 * 2. no logit is more than `max_steps` steps of the output's int8 scale from Python's (and
 *    both sides have the same rows: one per real token for a tagger);
 * 3. a row's answer (its argmax; per token for a tagger) may differ only where Python's own
 *    top-two margin on that row is below `near_tie_steps` steps, and a text's answer (label,
 *    or entities, words and tags) may differ only where such a row flipped (for a CRF tagger,
 *    whose Viterbi path can change with no emission's argmax changing, this is stricter than
 *    its decoding needs: such a change fails rather than passes unexplained).
 */
import RULES from "./parity_rules.json" with { type: "json" };

/** The numbers of the rules (e2e/parity_rules.json). */
export interface ParityRules {
  /** The fraction of texts whose logits must be bit-identical. */
  readonly min_bit_identical: number;
  /** The most int8 steps any logit may move. */
  readonly max_steps: number;
  /** A row may change its answer only where Python's top-two margin is below this, in steps. */
  readonly near_tie_steps: number;
}

/** The rules the browser test and `benchmarks/web_accuracy.py` apply. */
export const INT8_PARITY: ParityRules = RULES;

/** One text's outputs on one side: logits (`(C,)`, or `(n, C)` for a tagger) and result. */
export interface Outputs {
  readonly logits: readonly number[] | readonly (readonly number[])[];
  readonly result: Readonly<Record<string, unknown>>;
}

/** How one text fared. */
export interface TextParity {
  readonly text: string;
  /** Every logit equal, bit for bit. */
  readonly identical: boolean;
  /** The largest |Δlogit| in int8 steps (Infinity when the rows differ in number or width). */
  readonly steps: number;
  readonly sameAnswer: boolean;
  /** Rows whose argmax changed, with Python's top-two margin there in steps. */
  readonly flips: readonly { row: number; margin: number }[];
  /** Why this text breaks the rules (empty when it keeps them). */
  readonly failures: readonly string[];
}

/** How a set of texts fared, and every broken rule. */
export interface ParityReport {
  readonly texts: number;
  readonly identical: number;
  readonly sameAnswer: number;
  /** The largest |Δlogit| in int8 steps over the texts. */
  readonly maxSteps: number;
  readonly perText: readonly TextParity[];
  /** Every broken rule, one line each; empty when the page keeps them all. */
  readonly failures: readonly string[];
}

/** Logits as rows: a classifier's `(C,)` is one row. */
export function rowsOf(logits: Outputs["logits"]): readonly (readonly number[])[] {
  if (logits.length === 0) return [];
  return Array.isArray(logits[0]) ? (logits as readonly (readonly number[])[]) : [logits as readonly number[]];
}

/** The answer of a result, as a string: the label, or the entities, words and truncation. */
export function answerOf(result: Outputs["result"]): string {
  return JSON.stringify(result.label ?? [result.entities, result.words, result.num_truncated_words]);
}

function argmax(row: readonly number[]): number {
  return row.reduce((best, v, i) => (v > row[best] ? i : best), 0);
}

/** `value / step` to 1e-3: values on one int8 grid are whole steps apart, up to float error. */
function inSteps(value: number, step: number): number {
  return Math.round((value / step) * 1000) / 1000;
}

/** Python's top-two margin on `row`, in int8 steps (Infinity for a single label). */
export function marginSteps(row: readonly number[], step: number): number {
  const [first, second] = [...row].sort((x, y) => y - x);
  return second === undefined ? Infinity : inSteps(first - second, step);
}

/** One text: `python` and `page` outputs against the rules, `step` the output's int8 scale. */
export function textParity(text: string, python: Outputs, page: Outputs, step: number, rules: ParityRules = INT8_PARITY): TextParity {
  const [expected, got] = [rowsOf(python.logits), rowsOf(page.logits)];
  const sameAnswer = answerOf(python.result) === answerOf(page.result);
  const where = `"${text}"`;
  if (expected.length !== got.length || expected.some((row, i) => row.length !== got[i].length)) {
    const shape = (rows: typeof got) => `${rows.length} rows of ${rows[0]?.length ?? 0}`;
    const failures = [`${where}: Python gave ${shape(expected)} logits, the page ${shape(got)} (a token dropped or added)`];
    return { text, identical: false, steps: Infinity, sameAnswer, flips: [], failures };
  }
  const differences = expected.flatMap((row, i) => row.map((v, j) => Math.abs(v - got[i][j])));
  const steps = inSteps(Math.max(0, ...differences), step);
  const flips = expected.flatMap((row, i) => (argmax(row) === argmax(got[i]) ? [] : [{ row: i, margin: marginSteps(row, step) }]));
  const failures: string[] = [];
  if (!(steps <= rules.max_steps)) failures.push(`${where}: a logit moved ${steps.toFixed(2)} int8 steps (at most ${rules.max_steps})`);
  for (const flip of flips.filter((f) => !(f.margin < rules.near_tie_steps))) {
    failures.push(`${where}: row ${flip.row} changed its answer where Python's top two are ${flip.margin.toFixed(2)} steps apart (a near-tie is below ${rules.near_tie_steps})`);
  }
  if (!sameAnswer && flips.length === 0) failures.push(`${where}: another answer with the same argmax on every row (decoding or tokenization differs)`);
  return { text, identical: differences.every((d) => d === 0), steps, sameAnswer, flips, failures };
}

/**
 * Every text of one file against the rules.
 *
 * Example:
 * ```ts
 * const report = int8Parity(texts, pythonOutputs, pageOutputs, 0.0123);
 * expect(report.failures).toEqual([]);
 * ```
 *
 * @param texts the texts, in order.
 * @param python Python LiteRT's outputs on them (`tools/python_reference.py`).
 * @param page the page's outputs on them.
 * @param step the scale of the int8 tensor the logits are dequantized from.
 * @param rules the numbers (default: e2e/parity_rules.json).
 * @returns counts, the largest move in steps, each text's verdict and every failure.
 * @throws Error when the three lists differ in length or `step` is not a positive number.
 */
export function int8Parity(
  texts: readonly string[],
  python: readonly Outputs[],
  page: readonly Outputs[],
  step: number,
  rules: ParityRules = INT8_PARITY,
): ParityReport {
  if (python.length !== texts.length || page.length !== texts.length) {
    throw new Error(`int8Parity needs one Python and one page output per text: ${texts.length} texts, ${python.length} Python, ${page.length} page outputs. Received: texts.length=${texts.length}`);
  }
  if (!(step > 0)) throw new Error(`int8Parity needs the output's int8 scale, a positive number (python_reference.py's output_steps). Received: step=${step}`);
  const perText = texts.map((text, i) => textParity(text, python[i], page[i], step, rules));
  const identical = perText.filter((t) => t.identical).length;
  const failures = perText.flatMap((t) => t.failures);
  if (identical < rules.min_bit_identical * texts.length) {
    failures.push(`bit-identical logits on ${identical} of ${texts.length} texts, below ${rules.min_bit_identical * 100} %`);
  }
  return {
    texts: texts.length,
    identical,
    sameAnswer: perText.filter((t) => t.sameAnswer).length,
    maxSteps: Math.max(0, ...perText.map((t) => t.steps)),
    perText,
    failures,
  };
}
