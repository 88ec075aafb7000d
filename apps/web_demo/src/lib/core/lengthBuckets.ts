import { ModelAssetError } from "./errors";

/** One signature of a model: its key and the sequence length of its inputs. */
export interface Bucket {
  readonly signature: string;
  readonly length: number;
}

/**
 * The length buckets of a keras-attn `.tflite` file, and the one an input runs on (the Kotlin
 * core's `LengthBuckets`; `keras_attn.export.tflite.tflite_export.BucketedTFLite` in Python).
 *
 * `model_<variant>_buckets.tflite` holds one signature per input length over one copy of the
 * weights: `serving_default` at the card's sequence length and `tokens_<n>` for each shorter
 * one (16, 24, 32, 48, 64, ...). An input runs on the shortest signature that holds its real
 * tokens, its ids cut to that length ({@link LengthBuckets.cut}): the positions cut are
 * padding, which the attention mask hides, so the logits of the real tokens are those of the
 * full-length signature (within float rounding; int8: the same argmax). A fixed-length
 * `model_<variant>.tflite` has one signature: every input runs on it.
 *
 * Example:
 * ```ts
 * const buckets = new LengthBuckets({ serving_default: 128, tokens_16: 16, tokens_32: 32, tokens_64: 64 });
 * const inputs = tokenizer.encode(text, buckets.sequenceLength);
 * const bucket = buckets.pick(inputs.length);           // e.g. {signature: "tokens_32", length: 32}
 * const ids = LengthBuckets.cut(inputs.tokenIds, bucket.length);
 * ```
 */
export class LengthBuckets {
  /** The signature of the full length. */
  static readonly DEFAULT_SIGNATURE = "serving_default";
  /** The buckets, shortest first. */
  readonly buckets: readonly Bucket[];
  /** The longest length, `serving_default`'s: the card's `sequence_length`. */
  readonly sequenceLength: number;

  /**
   * @param lengths signature key -> length of its `token_ids` input (`[1, length]`), as the
   *     interpreter reports them.
   * @throws ModelAssetError when there is no signature, a length is not positive, two
   *     signatures share a length, or `serving_default` (when present) is not the longest.
   */
  constructor(lengths: Readonly<Record<string, number>>) {
    const entries = Object.entries(lengths);
    if (entries.length === 0) throw new ModelAssetError("the model has no signature");
    for (const [key, length] of entries) {
      if (!Number.isInteger(length) || length < 1) {
        throw new ModelAssetError(`signature "${key}" has input length ${length}`);
      }
    }
    this.buckets = entries.map(([signature, length]) => ({ signature, length })).sort((a, b) => a.length - b.length);
    for (let i = 1; i < this.buckets.length; i++) {
      const [previous, bucket] = [this.buckets[i - 1]!, this.buckets[i]!];
      if (bucket.length === previous.length) {
        throw new ModelAssetError(
          `signatures "${previous.signature}" and "${bucket.signature}" both take ${bucket.length} tokens: ` +
            "one signature per length expected",
        );
      }
    }
    this.sequenceLength = this.longest.length;
    const fallback = lengths[LengthBuckets.DEFAULT_SIGNATURE];
    if (Object.hasOwn(lengths, LengthBuckets.DEFAULT_SIGNATURE) && fallback !== this.sequenceLength) {
      throw new ModelAssetError(
        `"${LengthBuckets.DEFAULT_SIGNATURE}" takes ${fallback} tokens but "${this.longest.signature}" ` +
          `takes ${this.sequenceLength}: the default signature must be the longest`,
      );
    }
  }

  /** The longest bucket: `serving_default` of a keras-attn file. */
  get longest(): Bucket {
    return this.buckets[this.buckets.length - 1]!;
  }

  /**
   * The shortest bucket that holds `numTokens` real tokens (`[CLS]` and `[SEP]` included).
   *
   * @throws RangeError when `numTokens` is not in `[1, sequenceLength]` (encode with
   *     `sequenceLength` first: the tokenizer truncates to it).
   */
  pick(numTokens: number): Bucket {
    if (!Number.isInteger(numTokens) || numTokens < 1 || numTokens > this.sequenceLength) {
      throw new RangeError(`numTokens must be in [1, ${this.sequenceLength}] (the longest bucket), got ${numTokens}`);
    }
    return this.buckets.find((bucket) => bucket.length >= numTokens) ?? this.longest;
  }

  /** The first `length` entries of a padded input (`ids.length >= length`), as a copy. */
  static cut(ids: Int32Array, length: number): Int32Array {
    if (length > ids.length) throw new RangeError(`cannot cut ${ids.length} ids to ${length}`);
    return ids.slice(0, length);
  }
}
