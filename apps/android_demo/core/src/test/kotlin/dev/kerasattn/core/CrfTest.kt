package dev.kerasattn.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Test
import java.util.Random

/** Viterbi against brute force over all paths, and the hand-checked example. */
class CrfTest {
    private fun bruteForce(crf: CrfTransitions, emissions: Array<DoubleArray>): IntArray {
        val n = emissions.size
        val k = crf.numTags
        var best = IntArray(n)
        var bestScore = Double.NEGATIVE_INFINITY
        var total = 1
        repeat(n) { total *= k }
        for (code in 0 until total) {
            val path = IntArray(n)
            var rest = code
            for (i in n - 1 downTo 0) {
                path[i] = rest % k
                rest /= k
            }
            val score = crf.pathScore(emissions, path)
            if (score > bestScore) {
                bestScore = score
                best = path
            }
        }
        return best
    }

    @Test
    fun viterbiFindsTheBestPathOfRandomCases() {
        val random = Random(7)
        for (case in 0 until 300) {
            val k = 1 + random.nextInt(4)
            val n = 1 + random.nextInt(5)
            fun gaussian() = random.nextGaussian() * 2.0
            val crf = CrfTransitions(Array(k) { DoubleArray(k) { gaussian() } }, DoubleArray(k) { gaussian() }, DoubleArray(k) { gaussian() })
            val emissions = Array(n) { DoubleArray(k) { gaussian() } }
            val path = crf.viterbi(emissions)
            val expected = bruteForce(crf, emissions)
            assertEquals("case $case", crf.pathScore(emissions, expected), crf.pathScore(emissions, path), 1e-9)
            assertArrayEquals("case $case", expected, path)
        }
    }

    @Test
    fun transitionsOverrideEmissionsAndTiesGoToTheLowestTag() {
        // Tag 0 never follows tag 0 (the docstring example of keras_attn.layers.crf).
        val crf = CrfTransitions(arrayOf(doubleArrayOf(-5.0, 0.0), doubleArrayOf(0.0, 0.0)), DoubleArray(2), DoubleArray(2))
        assertArrayEquals(intArrayOf(0, 1), crf.viterbi(arrayOf(doubleArrayOf(2.0, 0.0), doubleArrayOf(1.0, 0.0))))
        val flat = CrfTransitions(Array(3) { DoubleArray(3) }, DoubleArray(3), DoubleArray(3))
        assertArrayEquals(intArrayOf(0, 0), flat.viterbi(Array(2) { DoubleArray(3) }))
        assertArrayEquals(IntArray(0), flat.viterbi(arrayOf()))
    }

    @Test(expected = IllegalArgumentException::class)
    fun mismatchedShapesAreRejected() {
        CrfTransitions(Array(2) { DoubleArray(3) }, DoubleArray(2), DoubleArray(2))
    }
}
