package dev.kerasattn.core

/**
 * Scores to decisions: argmax, softmax and top-k, in double precision.
 *
 * Example:
 * ```
 * Scores.softmax(doubleArrayOf(0.0, 0.0)).toList()  // [0.5, 0.5]
 * Scores.topK(doubleArrayOf(0.1, 0.7, 0.2), 2).toList()  // [1, 2]
 * ```
 */
object Scores {
    /** Index of the largest value; the first one on ties (as numpy's `argmax`). */
    @JvmStatic
    fun argmax(values: DoubleArray): Int {
        if (values.isEmpty()) throw IllegalArgumentException("argmax of an empty array")
        var best = 0
        for (i in 1 until values.size) if (values[i] > values[best]) best = i
        return best
    }

    /** `exp(x - max) / sum`, the probabilities of logits `x` (stable for large logits). */
    @JvmStatic
    fun softmax(logits: DoubleArray): DoubleArray {
        if (logits.isEmpty()) throw IllegalArgumentException("softmax of an empty array")
        val top = logits[argmax(logits)]
        val result = DoubleArray(logits.size)
        var sum = 0.0
        for (i in logits.indices) {
            result[i] = Math.exp(logits[i] - top)
            sum += result[i]
        }
        for (i in result.indices) result[i] /= sum
        return result
    }

    /** Indices of the `k` largest values, largest first (lower index first on ties). */
    @JvmStatic
    fun topK(values: DoubleArray, k: Int): IntArray {
        if (k < 0) throw IllegalArgumentException("k must be >= 0, got $k")
        val order = values.indices.sortedWith(Comparator { a, b ->
            val byValue = values[b].compareTo(values[a])
            if (byValue != 0) byValue else a.compareTo(b)
        })
        return order.take(minOf(k, values.size)).toIntArray()
    }

    /** Float model outputs as doubles (the decoders work in double precision). */
    @JvmStatic
    fun toDoubles(values: FloatArray): DoubleArray = DoubleArray(values.size) { values[it].toDouble() }
}
