package dev.kerasattn.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Assert.fail
import org.junit.Test

/** Which signature of a bucketed model an input runs on ([LengthBuckets]). */
class LengthBucketsTest {
    // The signatures of a CoNLL-2003 export (length 128), in the interpreter's order.
    private val conll = LengthBuckets(mapOf("serving_default" to 128, "tokens_16" to 16,
        "tokens_24" to 24, "tokens_32" to 32, "tokens_48" to 48, "tokens_64" to 64, "tokens_96" to 96))

    @Test
    fun theShortestBucketThatHoldsTheTokensIsPicked() {
        assertEquals(listOf(16, 24, 32, 48, 64, 96, 128), conll.buckets.map { it.length })
        assertEquals(128, conll.sequenceLength)
        val picked = listOf(1, 16, 17, 24, 25, 33, 64, 65, 96, 97, 128).map { conll.pick(it).signature }
        assertEquals(listOf("tokens_16", "tokens_16", "tokens_24", "tokens_24", "tokens_32", "tokens_48",
            "tokens_64", "tokens_96", "tokens_96", "serving_default", "serving_default"), picked)
    }

    @Test
    fun aFixedLengthFileRunsEverythingOnItsOneSignature() {
        val fixed = LengthBuckets(mapOf("serving_default" to 48))
        assertEquals("serving_default", fixed.pick(1).signature)
        assertEquals(48, fixed.pick(48).length)
    }

    @Test
    fun encodedInputsAreCutToTheBucket() {
        val tables = TextTables.load()
        val vocabulary = listOf("[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "good", "film")
        val tokenizer = WordPieceTokenizer(vocabulary, true, tables, 100, unknownToken = "[UNK]",
            clsToken = "[CLS]", sepToken = "[SEP]", padToken = "[PAD]")
        val buckets = LengthBuckets(mapOf("serving_default" to 32, "tokens_16" to 16))
        val inputs = tokenizer.encode("a good film", buckets.sequenceLength)
        val bucket = buckets.pick(inputs.length)
        assertEquals(5, inputs.length)
        assertEquals("tokens_16", bucket.signature)
        val ids = LengthBuckets.cut(inputs.tokenIds, bucket.length)
        assertArrayEquals(intArrayOf(2, 4, 5, 6, 3) + IntArray(11), ids)
        // Only padding is cut.
        assertTrue(inputs.paddingMask.drop(bucket.length).all { it == 0 })
    }

    @Test
    fun badSignaturesAndLengthsAreClearErrors() {
        expect("no signature") { LengthBuckets(emptyMap()) }
        expect("both take 16 tokens") { LengthBuckets(mapOf("serving_default" to 16, "tokens_16" to 16)) }
        expect("the default signature must be the longest") {
            LengthBuckets(mapOf("serving_default" to 16, "tokens_32" to 32))
        }
        expect("numTokens must be in [1, 128]") { conll.pick(129) }
        expect("numTokens must be in [1, 128]") { conll.pick(0) }
    }

    private fun expect(message: String, block: () -> Unit) {
        try {
            block()
            fail("expected an error containing \"$message\"")
        } catch (e: IllegalArgumentException) {
            assertTrue("\"${e.message}\" should contain \"$message\"", e.message!!.contains(message))
        }
    }
}
