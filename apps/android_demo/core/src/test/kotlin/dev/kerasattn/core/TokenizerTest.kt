package dev.kerasattn.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertArrayEquals
import org.junit.Test

/** WordPiece, normalization, offsets and packing on a hand-made vocabulary. */
class TokenizerTest {
    private val tables = TextTables.load()
    private val vocabulary = listOf("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
        "un", "##aff", "##able", "unaff", "the", "cat", "##s", "hello", "h", "##ello", "ss",
        "st", "##ras", "##se", "北", "京", ",", "a", "##a", "cafe", "é")

    private fun tokenizer(lowercase: Boolean, maxWordBytes: Int = 100) =
        WordPieceTokenizer(vocabulary, lowercase, tables, maxWordBytes)

    private fun tokens(pieces: Pieces): List<String> = pieces.ids.map { vocabulary[it] }

    @Test
    fun wordPieceTakesTheLongestMatchFromTheLeft() {
        // "unaff" beats "un"; what remains must be spelled with ## continuations.
        assertEquals(listOf("unaff", "##able"), tokens(tokenizer(true).tokenize("unaffable")))
        assertEquals(listOf("the", "cat", "##s"), tokens(tokenizer(true).tokenize("the cats")))
    }

    @Test
    fun aWordWithoutCompleteSpellingIsOneUnknownToken() {
        val pieces = tokenizer(true).tokenize("the catz cat")
        assertEquals(listOf("the", "[UNK]", "cat"), tokens(pieces))
        assertEquals(listOf(0, 4, 9), pieces.starts.toList())
        assertEquals(listOf(3, 8, 12), pieces.ends.toList())
    }

    @Test
    fun wordsLongerThanTheByteLimitAreUnknown() {
        val atLimit = "a".repeat(100)
        assertEquals(100, tokenizer(true).tokenize(atLimit).size)  // a ##a ##a ...
        assertEquals(listOf("[UNK]"), tokens(tokenizer(true).tokenize("a".repeat(101))))
        // The limit counts UTF-8 bytes after normalization: "é" is 2 bytes cased, 1 uncased.
        assertEquals(listOf("[UNK]"), tokens(tokenizer(false, 3).tokenize("éé")))
        assertEquals(listOf("a", "##a"), tokens(tokenizer(true, 3).tokenize("áÁ")))
    }

    @Test
    fun uncasedFoldsCaseAndStripsAccentsCasedKeepsThem() {
        assertEquals(listOf("hello"), tokens(tokenizer(true).tokenize("HÉLLO")))
        assertEquals(listOf("cafe"), tokens(tokenizer(true).tokenize("Cafe\u0301")))
        assertEquals(listOf("[UNK]"), tokens(tokenizer(false).tokenize("Hello")))
        assertEquals(listOf("é"), tokens(tokenizer(false).tokenize("é")))
        // Full case folding: ß -> ss, and the offsets of the pieces inside the expansion.
        val pieces = tokenizer(true).tokenize("Straße")
        assertEquals(listOf("st", "##ras", "##se"), tokens(pieces))
        assertArrayEquals(intArrayOf(0, 2, 4), pieces.starts)
        assertArrayEquals(intArrayOf(2, 4, 6), pieces.ends)
    }

    @Test
    fun cjkIdeographsAndPunctuationAreWordsOfTheirOwn() {
        val pieces = tokenizer(true).tokenize("北京,cat")
        assertEquals(listOf("北", "京", ",", "cat"), tokens(pieces))
        assertArrayEquals(intArrayOf(0, 1, 2, 3), pieces.starts)
    }

    @Test
    fun offsetsCountCodePointsAndRemovedCharactersStayWithThePieceBefore() {
        // U+1F600 is two UTF-16 units but one code point; U+200B is removed (uncased).
        val pieces = tokenizer(true).tokenize("\uD83D\uDE00 the\u200B cat")
        assertEquals(listOf("[UNK]", "the", "cat"), tokens(pieces))
        assertArrayEquals(intArrayOf(0, 2, 7), pieces.starts)
        assertArrayEquals(intArrayOf(1, 6, 10), pieces.ends)
        assertEquals("the\u200B", CodePoints.slice("\uD83D\uDE00 the\u200B cat", 2, 6))
        assertEquals(3, CodePoints.toUtf16Index("\uD83D\uDE00 the", 2))
    }

    @Test
    fun controlCharactersSeparateWordsAndLoneSurrogatesVanish() {
        assertEquals(listOf("the", "cat"), tokens(tokenizer(false).tokenize("the\u0007cat")))
        assertEquals(listOf("cat", "##s"), tokens(tokenizer(false).tokenize("cat\uD800s")))
    }

    @Test
    fun packingAddsSpecialsPadsAndCountsTruncation() {
        val t = tokenizer(true)
        val short = t.encode("the cat", 6)
        assertArrayEquals(intArrayOf(2, 9, 10, 3, 0, 0), short.tokenIds)
        assertArrayEquals(intArrayOf(1, 1, 1, 1, 0, 0), short.paddingMask)
        assertArrayEquals(IntArray(6), short.segmentIds)
        assertEquals(0, short.numTruncated)
        val long = t.encode("the cats the cat", 4)
        assertArrayEquals(intArrayOf(2, 9, 10, 3), long.tokenIds)
        assertEquals(3, long.numTruncated)
        assertEquals(4, long.length)
        val empty = t.encode("", 3)
        assertArrayEquals(intArrayOf(2, 3, 0), empty.tokenIds)
    }

    @Test
    fun vocabularyErrorsNameTheLine() {
        val error = try {
            WordPieceTokenizer(listOf("[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "the"), true, tables)
            null
        } catch (e: AssetException) {
            e
        }
        assertEquals("vocabulary line 6: token \"the\" repeats line 5", error?.message)
        val missing = try {
            WordPieceTokenizer(listOf("[PAD]", "[CLS]", "[SEP]"), true, tables)
            null
        } catch (e: AssetException) {
            e.message
        }
        assertEquals(true, missing?.contains("no unknown token \"[UNK]\""))
    }
}
