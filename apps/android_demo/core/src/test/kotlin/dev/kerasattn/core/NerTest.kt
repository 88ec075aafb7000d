package dev.kerasattn.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test

/** Word splitting, alignment, IOB2 repair and entity spans. */
class NerTest {
    private val tables = TextTables.load()
    private val vocabulary = listOf("[PAD]", "[UNK]", "[CLS]", "[SEP]", "peter", "visits", "paris", "new", "york", "##s", ".")
    private val tokenizer = WordPieceTokenizer(vocabulary, true, tables)
    private val labels = listOf("O", "B-LOC", "I-LOC", "B-PER", "I-PER")

    private fun words(text: String, stripAccents: Boolean = false) =
        Ner.splitWords(text, tables, stripAccents).map { "${it.text}@${it.start}-${it.end}" }

    @Test
    fun wordsFollowBertBasicTokenizationWithCodePointOffsets() {
        assertEquals(listOf("Hi@0-2", ",@2-3", "J@4-5", ".@5-6", "R@6-7", ".@7-8", "Tolkien@9-16", "!@16-17"),
            words("Hi, J.R. Tolkien!"))
        // CJK ideographs are single words; U+200B is removed inside a word, which keeps its span.
        assertEquals(listOf("北@0-1", "京@1-2", "ab@3-6"), words("北京 a\u200Bb"))
        // An astral character is one code point (two UTF-16 units).
        assertEquals(listOf("\uD83D\uDE00x@0-2", "y@3-4"), words("\uD83D\uDE00x y"))
        // Combining marks: kept cased, removed uncased (a span ends at the last kept
        // character); U+2028 separates.
        assertEquals(listOf("e\u0301@0-2", "x@3-4"), words("e\u0301\u2028x"))
        assertEquals(listOf("e@0-1", "x@3-4"), words("e\u0301\u2028x", stripAccents = true))
    }

    @Test
    fun repairFollowsTheConllevalRule() {
        assertEquals(Pair(listOf("O", "B-PER", "I-PER", "B-LOC", "B-ORG"), 2),
            Ner.repairIob2(listOf("O", "I-PER", "I-PER", "B-LOC", "I-ORG")))
        assertEquals(Pair(listOf("B-LOC"), 1), Ner.repairIob2(listOf("I-LOC")))
        assertEquals(Pair(listOf("B-PER", "B-LOC", "I-LOC"), 1), Ner.repairIob2(listOf("B-PER", "I-LOC", "I-LOC")))
        assertEquals(Pair(listOf<String>(), 0), Ner.repairIob2(listOf()))
        val message = try {
            Ner.repairIob2(listOf("O", "X-PER"))
            ""
        } catch (e: IllegalArgumentException) {
            e.message
        }
        assertEquals("malformed tag \"X-PER\" at position 1: expected 'O', 'B-<TYPE>' or 'I-<TYPE>'", message)
    }

    @Test
    fun spansJoinWordsOfOneEntity() {
        val text = "Peter visits New York."
        val words = Ner.splitWords(text, tables, true)
        val spans = Ner.entitySpans(listOf("B-PER", "O", "B-LOC", "I-LOC", "O"), words, text)
        assertEquals(listOf("PER[0, 5) \"Peter\"", "LOC[13, 21) \"New York\""), spans.map { it.toString() })
        // Strict reading: an I- after O belongs to no entity (repair first to keep it).
        assertTrue(Ner.entitySpans(listOf("O", "O", "I-LOC", "I-LOC", "O"), words, text).isEmpty())
    }

    @Test
    fun preparationAlignsPiecesToWordsAndCountsCutWords() {
        val prepared = Ner.prepare("Peter visits Paris .", tokenizer, tables, true, 5)
        // [CLS] peter visits paris [SEP]: "." does not fit.
        assertArrayEquals(intArrayOf(2, 4, 5, 6, 3), prepared.inputs.tokenIds)
        assertArrayEquals(intArrayOf(-1, 0, 1, 2, -1), prepared.wordIds)
        assertEquals(1, prepared.numTruncatedWords)
        val twoPieces = Ner.prepare("Paris Peters", tokenizer, tables, true, 4)
        // "peters" = peter ##s: its first piece fits, so it is not a truncated word.
        assertArrayEquals(intArrayOf(2, 6, 4, 3), twoPieces.inputs.tokenIds)
        assertEquals(0, twoPieces.numTruncatedWords)
        assertEquals(1, twoPieces.inputs.numTruncated)
        assertArrayEquals(intArrayOf(1, 2), twoPieces.firstPiecePositions())
    }

    @Test
    fun decodingReadsFirstPiecesAndFillsCutWordsWithO() {
        val text = "Peter visits Paris ."
        val prepared = Ner.prepare(text, tokenizer, tables, true, 4)  // "Paris" and "." cut
        val logits = Array(4) { DoubleArray(labels.size) }
        logits[1][3] = 5.0  // peter: B-PER
        logits[2][2] = 5.0  // visits: I-LOC (repaired to B-LOC)
        val entities = Ner.decode(prepared, logits, labels, null, text)
        assertEquals(listOf("B-PER", "B-LOC", "O", "O"), entities.tags)
        assertEquals(2, entities.numFilledWords)
        assertEquals(1, entities.numRepairs)
        assertEquals(listOf("PER[0, 5) \"Peter\"", "LOC[6, 12) \"visits\""), entities.spans.map { it.toString() })
    }
}
