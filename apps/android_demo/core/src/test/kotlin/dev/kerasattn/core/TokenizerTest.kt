package dev.kerasattn.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertArrayEquals
import org.junit.Test

/**
 * WordPiece, normalization, offsets and packing on a hand-made vocabulary. Every expected
 * piece and offset is HF `tokenizers`' answer (`BertWordPieceTokenizer` over this vocabulary,
 * tokenizers 0.22.2).
 */
class TokenizerTest {
    private val tables = TextTables.load()
    private val vocabulary = listOf("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
        "un", "##aff", "##able", "unaff", "the", "cat", "##s", "hello", "h", "##ello", "ss",
        "st", "##ras", "##se", "北", "京", ",", "a", "##a", "cafe", "é",
        "…", ".", "he", "##i", "##ße", "ij", "##´", "##b", "ω", "##ω", "e", "ab", "ᄒ", "##ᅡ", "##ᆫ", "##raße")

    private fun tokenizer(lowercase: Boolean, maxWordCharacters: Int = 100) =
        WordPieceTokenizer(vocabulary, lowercase, tables, maxWordCharacters)

    private fun tokens(pieces: Pieces): List<String> = pieces.ids.map { vocabulary[it] }

    /** `token@start-end` of every piece. */
    private fun spans(pieces: Pieces): List<String> =
        pieces.ids.indices.map { "${vocabulary[pieces.ids[it]]}@${pieces.starts[it]}-${pieces.ends[it]}" }

    @Test
    fun bundledTablesAnswerAsHfBertNormalizer() {
        // Values of HF tokenizers' BertNormalizer (0.22.2): no case folding, no compatibility mapping.
        fun normalize(c: Int, lowercase: Boolean) = tables.normalize(c, lowercase).toList()
        assertEquals(listOf(0xDF), normalize(0xDF, true))  // "ß" stays (not "ss")
        assertEquals(listOf(0x2026), normalize(0x2026, true))  // "…" stays (not "...")
        assertEquals(listOf(0x133), normalize(0x133, true))  // "ĳ" stays (not "ij")
        assertEquals(listOf(0xB4), normalize(0xB4, true))  // "´" stays
        assertEquals(listOf(0xFF41), normalize(0xFF21, true))  // full-width "Ａ" -> "ａ"
        assertEquals(listOf(0xFF21), normalize(0xFF21, false))
        assertEquals(listOf<Int>(), normalize(0x200B, false))  // zero-width space removed
        assertEquals(listOf<Int>(), normalize(0x07, false))  // control removed, not a space
        assertEquals(listOf(0x20), normalize(0x09, false))
        assertEquals(listOf<Int>(), normalize(0xE000, true))  // private use removed
        assertEquals(listOf(0x1100, 0x1161, 0x11A8), normalize(0xAC01, true))  // Hangul "각"
        assertEquals(listOf(0x5317), normalize(0x5317, true))  // CJK: not padded, class SINGLE
        assertEquals(TextTables.SINGLE, tables.tokenizerClass(0x5317))
    }

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
    fun wordsOfMoreThan100CharactersAreUnknown() {
        assertEquals(100, tokenizer(true).tokenize("a".repeat(100)).size)  // a ##a ##a ...
        assertEquals(listOf("[UNK]@0-101"), spans(tokenizer(true).tokenize("a".repeat(101))))
        // The limit counts characters, not UTF-8 bytes: 51 "ω" are 102 bytes but 51 pieces.
        for (lowercase in listOf(true, false)) {
            val pieces = tokenizer(lowercase).tokenize("ω".repeat(51))
            assertEquals(listOf("ω") + List(50) { "##ω" }, tokens(pieces))
            assertEquals((1..51).toList(), pieces.ends.toList())
            assertEquals(listOf("[UNK]@0-101"), spans(tokenizer(lowercase).tokenize("ω".repeat(101))))
        }
        assertEquals(listOf("ω", "##ω"), tokens(tokenizer(false, 2).tokenize("ωω")))
        assertEquals(listOf("[UNK]@0-2"), spans(tokenizer(false, 1).tokenize("ωω")))
        val error = try {
            tokenizer(false, 0)
            null
        } catch (e: IllegalArgumentException) {
            e.message
        }
        assertEquals("maxWordCharacters must be >= 1, got 0", error)
    }

    @Test
    fun uncasedLowerCasesAndStripsAccentsCasedKeepsThem() {
        assertEquals(listOf("hello"), tokens(tokenizer(true).tokenize("HÉLLO")))
        assertEquals(listOf("cafe"), tokens(tokenizer(true).tokenize("Cafe\u0301")))
        assertEquals(listOf("[UNK]"), tokens(tokenizer(false).tokenize("Hello")))
        assertEquals(listOf("é"), tokens(tokenizer(false).tokenize("é")))
        assertEquals(listOf("[UNK]@0-5"), spans(tokenizer(false).tokenize("Cafe\u0301")))
    }

    @Test
    fun noCompatibilityMappingOrCaseFolding() {
        // Issue 50's hard cases.
        for (lowercase in listOf(true, false)) {
            val t = tokenizer(lowercase)
            assertEquals(listOf("…@0-1"), spans(t.tokenize("…")))  // not three "."
            assertEquals(listOf("he@0-2", "##i@2-3", "##ße@3-5"), spans(t.tokenize("heiße")))  // not "ss"
            assertEquals(listOf("[UNK]@0-1"), spans(t.tokenize("ĳ")))  // not "ij"
            assertEquals(listOf("a@0-1", "##´@1-2", "##b@2-3"), spans(t.tokenize("a´b")))  // "´" kept
            assertEquals(listOf("…@1-2"), spans(t.tokenize("\u00AD…\u00AD")))  // soft hyphens removed
        }
        assertEquals(listOf("st@0-2", "##raße@2-6"), spans(tokenizer(true).tokenize("Straße")))
    }

    @Test
    fun charactersRemovedByNormalizationBelongToNoPiece() {
        assertEquals(listOf("e@0-1"), spans(tokenizer(true).tokenize("e\u0301")))
        assertEquals(listOf("[UNK]@0-2"), spans(tokenizer(false).tokenize("e\u0301")))  // the accent is kept cased
        assertEquals(listOf("ab@0-3"), spans(tokenizer(true).tokenize("a\u0301b\u0301")))
        assertEquals(listOf("ab@0-2"), spans(tokenizer(false).tokenize("ab\u200B")))
    }

    @Test
    fun piecesMadeFromOneCharacterSpanThatCharacter() {
        // "한" -> the jamo ᄒ ᅡ ᆫ (uncased NFD): three pieces, each [0, 1).
        assertEquals(listOf("ᄒ@0-1", "##ᅡ@0-1", "##ᆫ@0-1"), spans(tokenizer(true).tokenize("한")))
        assertEquals(listOf("[UNK]@0-1"), spans(tokenizer(false).tokenize("한")))
    }

    @Test
    fun cjkIdeographsAndPunctuationAreWordsOfTheirOwn() {
        assertEquals(listOf("北@0-1", "京@1-2", ",@2-3", "cat@3-6"), spans(tokenizer(true).tokenize("北京,cat")))
    }

    @Test
    fun offsetsCountCodePoints() {
        // U+1F600 is two UTF-16 units but one code point; U+200B is removed and in no piece.
        val text = "\uD83D\uDE00 the\u200B cat"
        for (lowercase in listOf(true, false)) {
            assertEquals(listOf("[UNK]@0-1", "the@2-5", "cat@7-10"), spans(tokenizer(lowercase).tokenize(text)))
        }
        assertEquals("the", CodePoints.slice(text, 2, 5))
        assertEquals(3, CodePoints.toUtf16Index("\uD83D\uDE00 the", 2))
    }

    @Test
    fun controlCharactersAndLoneSurrogatesAreRemoved() {
        // Removed, not a space: "the\u0007cat" is the one word "thecat" (no spelling here).
        assertEquals(listOf("[UNK]@0-7"), spans(tokenizer(false).tokenize("the\u0007cat")))
        assertEquals(listOf("cat", "##s"), tokens(tokenizer(false).tokenize("cat\uD800s")))
        assertArrayEquals(intArrayOf(1), tokenizer(false).tokenize("\uDC00cat").starts)
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
