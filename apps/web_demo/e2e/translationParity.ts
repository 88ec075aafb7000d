/**
 * The int8 rules of a translation file between Python LiteRT and the page, as one pure
 * function (e2e/translate.spec.ts applies it per decoding, greedy and beam search; the numbers
 * sit in e2e/parity_rules.json under `translation`, fixed before the page ran the file).
 *
 * A translation is a chain of argmaxes: where the int8 file's float parts (attention,
 * softmax, LayerNorm) round differently on the browser's kernels, a step at a near-tie can
 * pick another token and the sentence can part from there. What must hold:
 *
 * 1. at least `min_same_ids` of the sentences get Python's ids exactly;
 * 2. over all sentences, at least `min_token_agreement` of the token positions agree (each
 *    sentence counts the longer side's length, so a dropped or added token counts too).
 */
import RULES from "./parity_rules.json" with { type: "json" };

/** The numbers of the rules (e2e/parity_rules.json, `translation`). */
export interface TranslationRules {
  /** The fraction of sentences whose ids must equal Python's. */
  readonly min_same_ids: number;
  /** The fraction of token positions that must agree, over all sentences. */
  readonly min_token_agreement: number;
}

export const TRANSLATION_PARITY: TranslationRules = RULES.translation;

/** How a set of sentences fared, and every broken rule. */
export interface TranslationReport {
  readonly sentences: number;
  readonly sameIds: number;
  /** Positions where both sides have the same token, and positions counted. */
  readonly agreed: number;
  readonly positions: number;
  /** The sentences whose ids differ, with both sides' ids. */
  readonly parted: readonly { text: string; python: readonly number[]; page: readonly number[] }[];
  /** Every broken rule, one line each; empty when the page keeps them. */
  readonly failures: readonly string[];
}

/**
 * Every sentence's generated ids (up to EOS, excluded) on both sides against the rules.
 *
 * Example:
 * ```ts
 * const report = translationParity(texts, pythonIds, pageIds);
 * expect(report.failures).toEqual([]);
 * ```
 *
 * @throws Error when the three lists differ in length.
 */
export function translationParity(
  texts: readonly string[],
  python: readonly (readonly number[])[],
  page: readonly (readonly number[])[],
  rules: TranslationRules = TRANSLATION_PARITY,
): TranslationReport {
  if (python.length !== texts.length || page.length !== texts.length) {
    throw new Error(`translationParity needs one Python and one page id list per text: ${texts.length} texts, ${python.length} Python, ${page.length} page lists. Received: texts.length=${texts.length}`);
  }
  let agreed = 0;
  let positions = 0;
  const parted: TranslationReport["parted"][number][] = [];
  texts.forEach((text, i) => {
    const [a, b] = [python[i]!, page[i]!];
    positions += Math.max(a.length, b.length);
    agreed += a.filter((id, j) => b[j] === id).length;
    if (a.length !== b.length || a.some((id, j) => b[j] !== id)) parted.push({ text, python: a, page: b });
  });
  const sameIds = texts.length - parted.length;
  const failures: string[] = [];
  if (sameIds < rules.min_same_ids * texts.length) {
    failures.push(`Python's ids on ${sameIds} of ${texts.length} sentences, below ${rules.min_same_ids * 100} % (parted: ${parted.map((p) => `"${p.text}"`).join(", ")})`);
  }
  if (agreed < rules.min_token_agreement * positions) {
    failures.push(`the same token at ${agreed} of ${positions} positions, below ${rules.min_token_agreement * 100} %`);
  }
  return { sentences: texts.length, sameIds, agreed, positions, parted, failures };
}
