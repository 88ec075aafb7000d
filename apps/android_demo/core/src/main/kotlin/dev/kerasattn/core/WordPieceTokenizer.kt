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
 * BERT WordPiece tokenizer, a port of tensorflow-text's `FastBertTokenizer` as keras-attn's
 * `WordPieceTokenizer` uses it (`keras_attn/text/tokenizer.py`); ids and offsets are equal to
 * the Python ones (checked on every golden vector).
 *
 * Steps, per the reference:
 * 1. normalization, code point by code point ([TextTables.normalize]): control characters
 *    become spaces; uncased models also lower-case with full case folding (NFKC_Casefold:
 *    "ß" -> "ss", full-width "Ａ" -> "a", ligatures split), NFD-decompose and drop combining
 *    marks and default-ignorable characters (zero-width space, soft hyphen);
 * 2. pre-tokenization of the normalized text: whitespace separates words, each punctuation
 *    character and CJK ideograph is a word ([TextTables.tokenizerClass]);
 * 3. a word longer than `maxWordBytes` UTF-8 bytes becomes `[UNK]`; any other is split
 *    greedily into the longest vocabulary pieces from the left, continuations prefixed
 *    with `##`; a word with no complete spelling becomes one `[UNK]`.
 *
 * Offsets are code points of the original text (Python `str` indices; convert with
 * [CodePoints.toUtf16Index] for Android spans). A piece starts at the character its first
 * normalized character came from; it ends where the next normalized character comes from
 * (so characters removed by normalization stay with the piece before them, and a piece
 * that ends inside a character's expansion, "ß" -> "s" + "##s", ends before that character).
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
 * @param maxWordBytes the reference's word limit in UTF-8 bytes after normalization.
 */
class WordPieceTokenizer(
    vocabulary: List<String>,
    val lowercase: Boolean,
    private val tables: TextTables,
    val maxWordBytes: Int = 100,
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
        if (maxWordBytes < 1) throw IllegalArgumentException("maxWordBytes must be >= 1, got $maxWordBytes")
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
        val boundary = { q: Int -> if (q < n) source[q] else codePoints.size }
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
            addWord(normalized, position, end, boundary, ids, starts, ends)
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

    private fun addWord(
        normalized: IntList, begin: Int, end: Int, boundary: (Int) -> Int,
        ids: IntList, starts: IntList, ends: IntList
    ) {
        var bytes = 0
        for (i in begin until end) bytes += CodePoints.utf8Length(normalized[i])
        if (bytes > maxWordBytes) {
            ids.add(unknownId)
            starts.add(boundary(begin))
            ends.add(boundary(end))
            return
        }
        val firstPiece = ids.size
        var position = begin
        while (position < end) {
            var found = -1
            var foundEnd = position
            var stop = minOf(end, position + maxTokenLength)
            while (stop > position) {
                val piece = StringBuilder()
                if (position > begin) piece.append("##")
                for (i in position until stop) piece.appendCodePoint(normalized[i])
                val id = tokenToId[piece.toString()]
                if (id != null) {
                    found = id
                    foundEnd = stop
                    break
                }
                stop -= 1
            }
            if (found < 0) {
                // No spelling of the whole word: it is one unknown token.
                ids.truncate(firstPiece)
                starts.truncate(firstPiece)
                ends.truncate(firstPiece)
                ids.add(unknownId)
                starts.add(boundary(begin))
                ends.add(boundary(end))
                return
            }
            ids.add(found)
            starts.add(boundary(position))
            ends.add(boundary(foundEnd))
            position = foundEnd
        }
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
