package dev.kerasattn.core

/** Word pieces of a text: ids and `[start, end)` code-point offsets into the text. */
class Pieces(val ids: IntArray, val starts: IntArray, val ends: IntArray) {
    val size: Int get() = ids.size
}

/** Fixed-length model inputs of one text (batch of one). */
class ModelInputs(
    /** `[CLS] pieces [SEP]` then padding, `sequenceLength` ids. */
    val tokenIds: IntArray,
    /** All zeros (one segment). */
    val segmentIds: IntArray,
    /** 1 for real tokens, 0 for padding. */
    val paddingMask: IntArray,
    /** Number of real tokens (`[CLS]` and `[SEP]` included). */
    val length: Int,
    /** Word pieces cut to fit the sequence length. */
    val numTruncated: Int
)

/**
 * BERT WordPiece tokenizer: HF `tokenizers`' `BertNormalizer` + `BertPreTokenizer` +
 * `WordPiece` (what BERT and MiniLM were pretrained with), as keras-attn's Python
 * `WordPieceTokenizer` implements them (`keras_attn/text/tokenizer.py`); ids and offsets are
 * equal to the Python ones (checked on every golden vector).
 *
 * Steps, per the reference:
 * 1. normalization, code point by code point ([TextTables.normalize]): control and
 *    private-use characters are removed, whitespace becomes a space; uncased models also
 *    lower-case (Unicode lower-casing, not case folding: "ß" stays "ß"), NFD-decompose and
 *    drop nonspacing marks ("é" -> "e", "a\u0301" -> "a"; "´" and "…" stay, no
 *    compatibility mapping);
 * 2. pre-tokenization of the normalized text ([TextTables.tokenizerClass]): whitespace
 *    separates words, each punctuation character and CJK ideograph is a word;
 * 3. a word of more than `maxWordCharacters` characters becomes `[UNK]`; any other is split
 *    greedily into the longest vocabulary pieces from the left, continuations prefixed
 *    with `##`; a word with no complete spelling becomes one `[UNK]`.
 *
 * Offsets are code points of the original text (Python `str` indices; convert with
 * [CodePoints.toUtf16Index] for Android spans), as HF reports them: each normalized
 * character comes from one original character and spans it; a piece spans from the
 * character of its first normalized character to the end of the character of its last. So
 * characters removed by normalization (combining accents, zero-width and control
 * characters) belong to no piece ("e\u0301" -> "e" at [0, 1)), and every piece made from one
 * character ("한" -> three jamo pieces) spans that whole character.
 *
 * Example:
 * ```
 * val tokenizer = WordPieceTokenizer(listOf("[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "##s"),
 *     lowercase = true, tables = TextTables.load())
 * tokenizer.tokenize("The cats").ids.toList()  // [4, 5, 6]
 * ```
 *
 * @param vocabulary the tokens, index = id (`vocab.txt`).
 * @param lowercase uncased normalization (the card's `tokenizer.lowercase`; accents are
 *     stripped exactly when lower-casing, as in every keras-attn export).
 * @param tables the normalization and class tables.
 * @param maxWordCharacters the word limit in characters (code points) of the normalized word,
 *     HF's `max_input_chars_per_word`: a longer word is one `[UNK]`.
 */
class WordPieceTokenizer(
    vocabulary: List<String>,
    val lowercase: Boolean,
    private val tables: TextTables,
    val maxWordCharacters: Int = 100,
    unknownToken: String = "[UNK]",
    clsToken: String = "[CLS]",
    sepToken: String = "[SEP]",
    padToken: String = "[PAD]"
) {
    private val tokenToId = HashMap<String, Int>(vocabulary.size * 2)
    private val maxTokenLength: Int
    val vocabularySize: Int = vocabulary.size
    val unknownId: Int
    val clsId: Int
    val sepId: Int
    val padId: Int

    init {
        var longest = 1
        for ((id, token) in vocabulary.withIndex()) {
            if (token.length == 0) throw AssetException("vocabulary line ${id + 1} is empty: every line of vocab.txt must hold a token")
            if (tokenToId.containsKey(token)) {
                throw AssetException("vocabulary line ${id + 1}: token \"$token\" repeats line ${tokenToId[token]!! + 1}")
            }
            tokenToId[token] = id
            val length = token.codePointCount(0, token.length) - (if (token.startsWith("##")) 2 else 0)
            if (length > longest) longest = length
        }
        maxTokenLength = longest
        if (maxWordCharacters < 1) {
            throw IllegalArgumentException("maxWordCharacters must be >= 1, got $maxWordCharacters")
        }
        unknownId = special(unknownToken, "unknown")
        clsId = special(clsToken, "cls")
        sepId = special(sepToken, "sep")
        padId = special(padToken, "pad")
    }

    private fun special(token: String, name: String): Int = tokenToId[token]
        ?: throw AssetException("the vocabulary has no $name token \"$token\" (vocab.txt must be the model's BERT vocabulary)")

    /** The id of `token`, or `null`. */
    fun idOf(token: String): Int? = tokenToId[token]

    /**
     * Word pieces of a text with code-point offsets (`tokenize_with_offsets` in Python).
     *
     * @param text any string; lone surrogates are treated as removed characters.
     * @return ids and offsets of every piece (no special tokens, no truncation).
     */
    fun tokenize(text: String): Pieces {
        val codePoints = CodePoints.of(text)
        // Normalized characters and, for each, the index of the character it came from.
        val normalized = IntList(codePoints.size + 8)
        val source = IntList(codePoints.size + 8)
        for (i in codePoints.indices) {
            for (c in tables.normalize(codePoints[i], lowercase)) {
                normalized.add(c)
                source.add(i)
            }
        }
        val ids = IntList()
        val starts = IntList()
        val ends = IntList()
        val n = normalized.size
        var position = 0
        while (position < n) {
            val kind = tables.tokenizerClass(normalized[position])
            if (kind == TextTables.WHITESPACE) {
                position += 1
                continue
            }
            var end = position + 1
            if (kind != TextTables.SINGLE) {
                while (end < n && tables.tokenizerClass(normalized[end]) == TextTables.WORD) end += 1
            }
            addWord(normalized, source, position, end, ids, starts, ends)
            position = end
        }
        return Pieces(ids.toArray(), starts.toArray(), ends.toArray())
    }

    /**
     * Word-piece ids of pre-split words, each tokenized as a text of its own (Python
     * `tokenize_words`); a word can yield several pieces or none.
     */
    fun tokenizeWords(words: List<String>): List<IntArray> {
        val result = ArrayList<IntArray>(words.size)
        for (word in words) result.add(tokenize(word).ids)
        return result
    }

    /**
     * `[CLS] pieces [SEP]` padded to `sequenceLength`; pieces beyond `sequenceLength - 2`
     * are cut and counted.
     */
    fun pack(pieceIds: IntArray, sequenceLength: Int): ModelInputs {
        if (sequenceLength < 2) throw IllegalArgumentException("sequenceLength must be >= 2 ([CLS] and [SEP]), got $sequenceLength")
        val kept = minOf(pieceIds.size, sequenceLength - 2)
        val tokenIds = IntArray(sequenceLength) { padId }
        val mask = IntArray(sequenceLength)
        tokenIds[0] = clsId
        System.arraycopy(pieceIds, 0, tokenIds, 1, kept)
        tokenIds[kept + 1] = sepId
        for (i in 0 until kept + 2) mask[i] = 1
        return ModelInputs(tokenIds, IntArray(sequenceLength), mask, kept + 2, pieceIds.size - kept)
    }

    /** Packed classifier inputs of a text: `pack(tokenize(text).ids, sequenceLength)`. */
    fun encode(text: String, sequenceLength: Int): ModelInputs = pack(tokenize(text).ids, sequenceLength)

    /**
     * The pieces of the word `normalized[begin, end)`, appended to `ids`, `starts`, `ends`;
     * `source[q]` is the original character of `normalized[q]`.
     */
    private fun addWord(
        normalized: IntList, source: IntList, begin: Int, end: Int,
        ids: IntList, starts: IntList, ends: IntList
    ) {
        val firstPiece = ids.size
        var position = begin
        while (position < end && end - begin <= maxWordCharacters) {
            val (found, foundEnd) = longestPiece(normalized, position, end, position > begin)
            if (found < 0) break
            ids.add(found)
            starts.add(source[position])
            ends.add(source[foundEnd - 1] + 1)
            position = foundEnd
            if (position == end) return
        }
        // Too long, or no spelling of the whole word: it is one unknown token.
        ids.truncate(firstPiece)
        starts.truncate(firstPiece)
        ends.truncate(firstPiece)
        ids.add(unknownId)
        starts.add(source[begin])
        ends.add(source[end - 1] + 1)
    }

    /** `(id, stop)` of the longest vocabulary piece `normalized[position, stop)`, or `(-1, position)`. */
    private fun longestPiece(normalized: IntList, position: Int, end: Int, continuation: Boolean): Pair<Int, Int> {
        var stop = minOf(end, position + maxTokenLength)
        val piece = StringBuilder()
        while (stop > position) {
            piece.setLength(0)
            if (continuation) piece.append("##")
            for (i in position until stop) piece.appendCodePoint(normalized[i])
            val id = tokenToId[piece.toString()]
            if (id != null) return Pair(id, stop)
            stop -= 1
        }
        return Pair(-1, position)
    }
}

/** A growable IntArray (no boxing). */
internal class IntList(capacity: Int = 16) {
    private var values = IntArray(maxOf(capacity, 4))
    var size = 0
        private set

    fun add(value: Int) {
        if (size == values.size) values = values.copyOf(size * 2)
        values[size] = value
        size += 1
    }

    operator fun get(index: Int): Int {
        if (index >= size) throw IndexOutOfBoundsException("index $index, size $size")
        return values[index]
    }

    fun truncate(newSize: Int) {
        size = newSize
    }

    fun toArray(): IntArray = values.copyOf(size)
}

/** Code points of Kotlin (UTF-16) strings, and conversions between the two kinds of index. */
object CodePoints {
    /** The code points of `text` (a lone surrogate is its own code point). */
    @JvmStatic
    fun of(text: String): IntArray {
        val result = IntArray(text.codePointCount(0, text.length))
        var index = 0
        var i = 0
        while (index < text.length) {
            val c = text.codePointAt(index)
            result[i] = c
            i += 1
            index += Character.charCount(c)
        }
        return result
    }

    /** The UTF-16 index of code-point offset `offset` of `text` (for `substring`, spans). */
    @JvmStatic
    fun toUtf16Index(text: String, offset: Int): Int = text.offsetByCodePoints(0, offset)

    /** `text[start:end]` in Python terms: the code points `[start, end)` of `text`. */
    @JvmStatic
    fun slice(text: String, start: Int, end: Int): String {
        val from = text.offsetByCodePoints(0, start)
        return text.substring(from, text.offsetByCodePoints(from, end - start))
    }

    /** A string of code points. */
    @JvmStatic
    fun string(codePoints: IntArray, from: Int = 0, to: Int = codePoints.size): String {
        val out = StringBuilder()
        for (i in from until to) out.appendCodePoint(codePoints[i])
        return out.toString()
    }

    /** UTF-8 length of one code point (3 for a lone surrogate, as a replacement character). */
    @JvmStatic
    fun utf8Length(codePoint: Int): Int = when {
        codePoint < 0x80 -> 1
        codePoint < 0x800 -> 2
        codePoint < 0x10000 -> 3
        else -> 4
    }
}
