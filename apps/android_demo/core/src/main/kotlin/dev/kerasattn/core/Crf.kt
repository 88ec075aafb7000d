package dev.kerasattn.core

/**
 * The transition scores of a linear-chain CRF tagger (the model card's `crf` entry) and its
 * Viterbi decoder, in double precision:
 *
 *     delta_1 = start + E_1,   delta_i[j] = max_k(delta_{i-1}[k] + A[k][j]) + E_i[j]
 *     y_n = argmax_j(delta_n[j] + end[j]),   y_{i-1} = backpointer_i[y_i]
 *
 * The additions happen in the order of the Python reference
 * (`keras_attn.export.golden_vectors.viterbi_float64`), so the same doubles in give the same
 * path out, ties included (the lowest tag index wins).
 *
 * Example:
 * ```
 * val crf = CrfTransitions(arrayOf(doubleArrayOf(-5.0, 0.0), doubleArrayOf(0.0, 0.0)), DoubleArray(2), DoubleArray(2))
 * crf.viterbi(arrayOf(doubleArrayOf(2.0, 0.0), doubleArrayOf(1.0, 0.0))).toList()  // [0, 1]
 * ```
 *
 * @param transitions `A[i][j]`, the score of tag `i` followed by tag `j`, `(K, K)`.
 * @param start scores of the first tag, `(K,)`.
 * @param end scores of the last tag, `(K,)`.
 */
class CrfTransitions(val transitions: Array<DoubleArray>, val start: DoubleArray, val end: DoubleArray) {
    val numTags: Int = start.size

    init {
        if (numTags == 0 || end.size != numTags || transitions.size != numTags || transitions.any { it.size != numTags }) {
            throw IllegalArgumentException("CRF weights must be transitions (K, K), start and end (K,); got " +
                "${transitions.size} rows, ${start.size} start and ${end.size} end scores")
        }
    }

    /**
     * The highest-scoring tag path of `emissions` (`[position][tag]`, real positions only).
     *
     * @return one tag index per position (empty for no positions).
     */
    fun viterbi(emissions: Array<DoubleArray>): IntArray {
        val n = emissions.size
        if (n == 0) return IntArray(0)
        for ((i, row) in emissions.withIndex()) {
            if (row.size != numTags) throw IllegalArgumentException("emissions[$i] has ${row.size} scores, the CRF has $numTags tags")
        }
        var delta = DoubleArray(numTags) { start[it] + emissions[0][it] }
        val backpointers = Array(n) { IntArray(numTags) }
        for (i in 1 until n) {
            val next = DoubleArray(numTags)
            for (j in 0 until numTags) {
                var bestK = 0
                var best = delta[0] + transitions[0][j]
                for (k in 1 until numTags) {
                    val candidate = delta[k] + transitions[k][j]
                    if (candidate > best) {
                        best = candidate
                        bestK = k
                    }
                }
                backpointers[i][j] = bestK
                next[j] = best + emissions[i][j]
            }
            delta = next
        }
        val last = DoubleArray(numTags) { delta[it] + end[it] }
        val path = IntArray(n)
        path[n - 1] = Scores.argmax(last)
        for (i in n - 1 downTo 1) path[i - 1] = backpointers[i][path[i]]
        return path
    }

    /** Total score of one path (`s(y)` above), for tests and debugging. */
    fun pathScore(emissions: Array<DoubleArray>, path: IntArray): Double {
        if (path.isEmpty()) return 0.0
        var score = start[path[0]] + emissions[0][path[0]]
        for (i in 1 until path.size) score += transitions[path[i - 1]][path[i]] + emissions[i][path[i]]
        return score + end[path[path.size - 1]]
    }
}
