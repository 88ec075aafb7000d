import type { Precision } from "./crf";
import type { ModelCard } from "./modelCard";
import { type TaggerInputs, decodeNer } from "./ner";
import { argmax, softmax } from "./scores";

/** A classifier's result: the label and the probability of every label (`label -> p`). */
export interface ClassificationResult {
  label: string;
  probabilities: Record<string, number>;
}

/** An entity of a tagger's result; `start`/`end` are code-point offsets (end exclusive). */
export interface NerEntity {
  type: string;
  start: number;
  end: number;
  text: string;
}

/** A word of a tagger's result with its (repaired IOB2) tag; offsets in code points. */
export interface NerWord {
  text: string;
  start: number;
  end: number;
  tag: string;
}

/** A tagger's result (key names as Python prints them). */
export interface NerResult {
  entities: NerEntity[];
  words: NerWord[];
  /** Words whose first piece fell beyond the sequence length (tagged "O"). */
  num_truncated_words: number;
}

/** The result of one text, as `keras-attn predict --json` prints it (without `line`, `text`). */
export type PredictResult = ClassificationResult | NerResult;

/**
 * A classifier's result from its logits, as `keras-attn predict --json` prints it for an
 * ids-in `.tflite` file (`keras_attn.stages.inference.predictor._classification_result`): the
 * probabilities are the softmax of the float32 logits in float64, the label is the argmax of
 * the probabilities (first on ties).
 *
 *     p_i = exp(z_i - max(z)) / sum_j exp(z_j - max(z))
 *
 * Labels that look like integers ("0", "1") come first in `JSON.stringify`'s output, in
 * numeric order: a JavaScript object orders such keys so; Python keeps the card's order.
 *
 * Example:
 * ```ts
 * classificationResult(["negative", "positive"], new Float32Array([0, 1]));
 * // {label: "positive", probabilities: {negative: 0.2689414213699951, positive: 0.7310585786300049}}
 * ```
 *
 * @param labels the card's labels, in output order.
 * @param logits the model's `[1, labels]` output.
 */
export function classificationResult(labels: readonly string[], logits: ArrayLike<number>): ClassificationResult {
  if (logits.length !== labels.length) {
    throw new RangeError(`logits hold ${logits.length} scores, the card has ${labels.length} labels`);
  }
  const probabilities = softmax(logits);
  return {
    label: labels[argmax(probabilities)]!,
    probabilities: Object.fromEntries(labels.map((label, i) => [label, probabilities[i]!])),
  };
}

/**
 * A tagger's result from its logits, as `keras-attn predict --json` prints it for an ids-in
 * `.tflite` file (`keras_attn.stages.inference.predictor._ner_result` over
 * `keras_attn.text.entity_prediction.predict_entities`): the tag of each word's first piece
 * (argmax, or the CRF's Viterbi path in float32 as `keras_attn.layers.crf.viterbi_decode`
 * runs it), IOB2-repaired, and the entity spans.
 *
 * Example:
 * ```ts
 * const prepared = prepareNer(text, tokenizer, tables, card.stripAccents, card.sequenceLength);
 * // logits: rows of the model's [1, length, labels] output (Float32Arrays)
 * nerResult(prepared, logits, card, text);
 * // {entities: [{type: "PER", start: 0, end: 5, text: "Peter"}], words: [...], num_truncated_words: 0}
 * ```
 *
 * @param prepared what `prepareNer` made of `text`.
 * @param logits `[position][label]` scores of at least the real positions.
 * @param card the tagger's card (labels, CRF transitions).
 * @param text the text.
 * @param precision the CRF's arithmetic, `"float32"` (as `predict`) by default.
 */
export function nerResult(
  prepared: TaggerInputs,
  logits: readonly ArrayLike<number>[],
  card: ModelCard,
  text: string,
  precision: Precision = "float32",
): NerResult {
  const decoded = decodeNer(prepared, logits, card.labels, card.crf, text, precision);
  return {
    entities: decoded.spans.map((span) => ({
      type: span.type,
      start: span.startChar,
      end: span.endChar,
      text: span.text,
    })),
    words: decoded.words.map((word, i) => ({
      text: word.text,
      start: word.start,
      end: word.end,
      tag: decoded.tags[i]!,
    })),
    num_truncated_words: prepared.numTruncatedWords,
  };
}
