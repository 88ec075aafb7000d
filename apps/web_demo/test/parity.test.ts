/**
 * The int8 parity rules (e2e/parity.ts) must pass the page's real outputs and fail mutated
 * ones: hand-made logits with known steps and margins, then outputs recorded from the browser
 * test on the test exports (test/fixtures/int8_parity.json, written by
 * `WEB_PARITY_RECORD=test/fixtures/int8_parity.json WEB_TEST_EXPORTS=... npx playwright test`:
 * Python LiteRT's and the page's outputs of model_int8.tflite on 40 golden texts of each
 * export, every text the page moved among them, and the page's outputs of its copy with one
 * head weight nudged 16 steps).
 */
import { readFileSync } from "node:fs";

import { describe, expect, test } from "vitest";

import { INT8_PARITY, int8Parity, marginSteps, rowsOf, textParity, type Outputs } from "../e2e/parity";

const STEP = 0.5;
/** Round numbers for the hand-made cases; the rules in force are tested on their own. */
const RULES = { min_bit_identical: 0.95, max_steps: 4, near_tie_steps: 4 };
const label = (logits: number[]) => ({ logits, result: { label: logits[0] >= logits[1] ? "a" : "b" } });

describe("int8 parity rules, on hand-made logits", () => {
  test("the rules in force are the ones docs/web.md states", () => {
    expect(INT8_PARITY).toMatchObject({ min_bit_identical: 0.95, max_steps: 3, near_tie_steps: 4 });
  });

  test("margins count int8 steps of Python's top two", () => {
    expect(marginSteps([1.0, 3.0, 2.0], STEP)).toBe(2);
    expect(marginSteps([7], STEP)).toBe(Infinity);
  });

  test("bit-identical outputs keep the rules", () => {
    const outputs = [label([1, 0]), label([0, 2])];
    const report = int8Parity(["x", "y"], outputs, outputs, STEP, RULES);
    expect(report).toMatchObject({ texts: 2, identical: 2, sameAnswer: 2, maxSteps: 0, failures: [] });
  });

  test("a logit may move up to the cap, not beyond", () => {
    expect(textParity("t", label([5, 0]), label([5 + 4 * STEP, 0]), STEP, RULES).failures).toEqual([]);
    expect(textParity("t", label([5, 0]), label([5 + 5 * STEP, 0]), STEP, RULES).failures).toEqual([
      '"t": a logit moved 5.00 int8 steps (at most 4)',
    ]);
  });

  test("an answer may flip at a near-tie only", () => {
    // Python's margin 3 steps (< 4): the page's 2-step moves flip it, which is allowed.
    const nearTie = textParity("t", label([1.5, 0]), label([0.5, 0.5 + 2 * STEP]), STEP, RULES);
    expect(nearTie.flips).toEqual([{ row: 0, margin: 3 }]);
    expect(nearTie.failures).toEqual([]);
    // Margin 4 steps: a flip is a failure even though each logit moved within the cap.
    const wide = textParity("t", label([2, 0]), label([1, 1.5]), STEP, RULES);
    expect(wide.steps).toBe(3);
    expect(wide.failures).toEqual([`"t": row 0 changed its answer where Python's top two are 4.00 steps apart (a near-tie is below 4)`]);
  });

  test("a tagger is judged per token, and its answer must follow its rows", () => {
    const tags = (rows: number[][], words: string[]) => ({ logits: rows, result: { entities: [], words, num_truncated_words: 0 } });
    const python = tags([[9, 0], [0.5, 0], [0, 9]], ["O", "O", "B"]);
    // Row 1 (margin 1 step) flips: allowed; row 0 keeps a 9-step lead.
    expect(textParity("t", python, tags([[9, 0], [0.5, 1], [0, 9]], ["O", "B", "B"]), STEP, RULES).failures).toEqual([]);
    // Another answer with no row flipped: the decoding or the tokenization differs.
    expect(textParity("t", python, tags([[9, 0], [0.5, 0], [0, 9]], ["O", "B", "B"]), STEP, RULES).failures).toEqual([
      '"t": another answer with the same argmax on every row (decoding or tokenization differs)',
    ]);
  });

  test("fewer than 95 % bit-identical texts fail even when every move is small", () => {
    const python = Array.from({ length: 20 }, (_, i) => label([i, 0]));
    const page = python.map((o, i) => (i < 2 ? label([i + STEP, 0]) : o));
    const report = int8Parity(python.map((_, i) => `t${i}`), python, page, STEP, RULES);
    expect(report.identical).toBe(18);
    expect(report.failures).toEqual(["bit-identical logits on 18 of 20 texts, below 95 %"]);
  });

  test("bad arguments get clear errors", () => {
    expect(() => int8Parity(["a"], [], [], STEP)).toThrow("one Python and one page output per text");
    expect(() => int8Parity([], [], [], 0)).toThrow("Received: step=0");
  });
});

interface Recorded {
  step: number;
  records: (Outputs & { text: string })[];
  page: Outputs[];
  nudged: { tensor: string; before: number; after: number; page: Outputs[] };
}
/** The recording, its logits back to float32 (it holds the shortest decimals of each). */
const RECORDED: Record<string, Recorded> = JSON.parse(
  readFileSync(new URL("fixtures/int8_parity.json", import.meta.url), "utf-8"),
  (_, v) => (typeof v === "number" ? Math.fround(v) : v),
);

describe.each(Object.entries(RECORDED))("int8 parity rules, on the %s test export's recorded outputs", (task, recorded) => {
  const texts = recorded.records.map((r) => r.text);
  const check = (page: Outputs[]) => int8Parity(texts, recorded.records, page, recorded.step);

  test("the page's outputs keep the rules", () => {
    const report = check(recorded.page);
    expect(texts.length).toBe(40);
    expect(report.failures).toEqual([]);
    // The recording holds every text the page moved (1 int8 step, on the tagger's export).
    expect(report.maxSteps).toBe(task === "ner" ? 1 : 0);
  });

  test("one more text moved by a single step breaks the 95 % rate where it was reached", () => {
    const report = check(recorded.page);
    const i = report.perText.findIndex((t) => t.identical);
    const moved = recorded.page.map((o, j) => {
      if (j !== i) return o;
      const rows = rowsOf(o.logits).map((row) => [...row]);
      rows[0][rows[0].indexOf(Math.max(...rows[0]))] += recorded.step; // its lead grows: no flip
      return { ...o, logits: rows };
    });
    const after = check(moved);
    expect(after.identical).toBe(report.identical - 1);
    expect(after.failures.length > 0).toBe(report.identical - 1 < 0.95 * texts.length);
  });

  test("a page result that drops one token (a tagger) or one label's logit fails", () => {
    const i = task === "ner" ? recorded.page.findIndex((o) => rowsOf(o.logits).length > 2) : 0;
    const rows = rowsOf(recorded.page[i].logits);
    const cut = task === "ner" ? rows.slice(0, -2).concat(rows.slice(-1)) : [rows[0].slice(1)];
    const dropped = recorded.page.map((o, j) => (j === i ? { ...o, logits: cut } : o));
    expect(check(dropped).failures[0]).toContain(`"${texts[i]}": Python gave ${rows.length} rows of ${rows[0].length} logits, the page ${cut.length} rows of ${cut[0].length} (a token dropped or added)`);
  });

  test("the page's outputs of a file with one weight nudged fail", () => {
    expect(recorded.nudged.after).not.toBe(recorded.nudged.before);
    expect(check(recorded.nudged.page).failures.length).toBeGreaterThan(0);
  });
});
