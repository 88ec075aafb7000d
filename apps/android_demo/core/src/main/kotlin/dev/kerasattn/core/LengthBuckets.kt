package dev.kerasattn.core

/** One signature of a model: its key and the sequence length of its inputs. */
class Bucket(val signature: String, val length: Int) {
    override fun toString() = "$signature ($length)"
}

/**
 * The length buckets of a keras-attn `.tflite` file, and the one an input runs on.
 *
 * `model_<variant>_buckets.tflite` (written by `keras_attn.export.tflite_export` with
 * `buckets`) holds one signature per input length over one copy of the weights:
 * `serving_default` at the card's sequence length and `tokens_<n>` for each shorter one
 * (16, 24, 32, 48, 64, ...). An input runs on the shortest signature that holds its real tokens,
 * its ids cut to that length ([cut]): the positions cut are padding, which the attention
 * mask hides, so the logits of the real tokens are those of the full-length signature
 * (within float rounding; int8: the same argmax). A fixed-length `model_<variant>.tflite`
 * has one signature: every input runs on it.
 *
 * Example:
 * ```
 * val buckets = LengthBuckets(mapOf("serving_default" to 128, "tokens_16" to 16, "tokens_32" to 32, "tokens_64" to 64))
 * buckets.pick(20)                       // Bucket("tokens_32", 32)
 * val inputs = tokenizer.encode(text, buckets.sequenceLength)
 * val bucket = buckets.pick(inputs.length)
 * interpreter.runSignature(mapOf("token_ids" to arrayOf(LengthBuckets.cut(inputs.tokenIds, bucket.length)), ...), outputs, bucket.signature)
 * ```
 *
 * @param lengths signature key -> length of its `token_ids` input (`[1, length]`), as the
 *   interpreter reports them.
 * @throws AssetException when there is no signature, a length is not positive, two signatures
 *   share a length, or `serving_default` (when present) is not the longest.
 */
class LengthBuckets(lengths: Map<String, Int>) {
    /** The buckets, shortest first. */
    val buckets: List<Bucket>
    /** The longest length, `serving_default`'s: the card's `sequence_length`. */
    val sequenceLength: Int

    init {
        if (lengths.isEmpty()) throw AssetException("the model has no signature")
        for ((key, length) in lengths) {
            if (length < 1) throw AssetException("signature \"$key\" has input length $length")
        }
        buckets = lengths.map { Bucket(it.key, it.value) }.sortedBy { it.length }
        for (i in 1 until buckets.size) {
            if (buckets[i].length == buckets[i - 1].length) {
                throw AssetException("signatures \"${buckets[i - 1].signature}\" and \"${buckets[i].signature}\" " +
                    "both take ${buckets[i].length} tokens: one signature per length expected")
            }
        }
        sequenceLength = buckets.last().length
        val default = lengths[DEFAULT_SIGNATURE]
        if (default != null && default != sequenceLength) {
            throw AssetException("\"$DEFAULT_SIGNATURE\" takes $default tokens but \"${buckets.last().signature}\" " +
                "takes $sequenceLength: the default signature must be the longest")
        }
    }

    /** The longest bucket: `serving_default` of a keras-attn file. */
    val longest: Bucket get() = buckets.last()

    /**
     * The shortest bucket that holds `numTokens` real tokens (`[CLS]` and `[SEP]` included).
     *
     * @throws IllegalArgumentException when `numTokens` is not positive or exceeds [sequenceLength]
     *   (encode with [sequenceLength] first: the tokenizer truncates to it).
     */
    fun pick(numTokens: Int): Bucket {
        if (numTokens < 1 || numTokens > sequenceLength) {
            throw IllegalArgumentException("numTokens must be in [1, $sequenceLength] (the longest bucket), got $numTokens")
        }
        for (bucket in buckets) {
            if (bucket.length >= numTokens) return bucket
        }
        return longest
    }

    companion object {
        const val DEFAULT_SIGNATURE = "serving_default"

        /** The first `length` entries of a padded input (`ids.size` >= `length`). */
        @JvmStatic
        fun cut(ids: IntArray, length: Int): IntArray {
            if (length > ids.size) throw IllegalArgumentException("cannot cut ${ids.size} ids to $length")
            return ids.copyOf(length)
        }
    }
}
