package dev.kerasattn.core

/** One word of a raw text: its kept characters and its `[start, end)` code-point span. */
class Word(val text: String, val start: Int, val end: Int) {
    override fun toString(): String = "Word($text, $start, $end)"
}

/** An entity over words `[startWord, endWord)`, characters `[startChar, endChar)` (code points). */
class EntitySpan(
    val type: String,
    val startWord: Int,
    val endWord: Int,
    val startChar: Int,
    val endChar: Int,
    val text: String
) {
    override fun toString(): String = "$type[$startChar, $endChar) \"$text\""
}

/** Tagger inputs of one text, and where each word's first piece is. */
class TaggerInputs(
    val words: List<Word>,
    val inputs: ModelInputs,
    /** Word index of each position, -1 for `[CLS]`, `[SEP]` and padding. */
    val wordIds: IntArray,
    /** Words whose first piece fell beyond the sequence length. */
    val numTruncatedWords: Int
) {
    /** Positions of the first piece of each word, in order (where a word's tag is read). */
    fun firstPiecePositions(): IntArray {
        val positions = IntList()
        var previous = -1
        for (p in wordIds.indices) {
            val word = wordIds[p]
            if (word >= 0 && word != previous) positions.add(p)
            previous = word
        }
        return positions.toArray()
    }
}

/** The tagger's reading of one text: a repaired IOB2 tag per word and the entity spans. */
class Entities(
    val words: List<Word>,
    val tags: List<String>,
    val spans: List<EntitySpan>,
    /** Words tagged "O" because they had no piece (cut by the sequence length, or empty). */
    val numFilledWords: Int,
    /** Tags changed by the IOB2 repair. */
    val numRepairs: Int
)

/**
 * Raw text -> words -> tagger inputs -> word tags -> entity spans: the Kotlin port of
 * `keras_attn.text.word_splitter.split_words`, `entity_prediction.ner_model_inputs`,
 * `ner.decode_word_labels`, `ner.repair_iob2` and `ner.entity_spans`.
 *
 * Example:
 * ```
 * val prepared = Ner.prepare("Peter visits Paris", tokenizer, tables, stripAccents = false, sequenceLength = 32)
 * // run the model on prepared.inputs, then
 * val entities = Ner.decode(prepared, logits, labels, crf = null, text = "Peter visits Paris")
 * ```
 */
object Ner {
    /**
     * Words of a text by BERT's basic tokenization (whitespace, punctuation and CJK
     * ideographs; control and format characters removed), offsets in code points.
     *
     * @param stripAccents the tokenizer's `strip_accents` (BERT uncased also removes `Mn`).
     */
    @JvmStatic
    fun splitWords(text: String, tables: TextTables, stripAccents: Boolean): List<Word> {
        val codePoints = CodePoints.of(text)
        val words = ArrayList<Word>()
        var current: StringBuilder? = null
        var start = 0
        var end = 0
        for (position in codePoints.indices) {
            val c = codePoints[position]
            val kind = tables.wordClass(c, stripAccents)
            if (kind == TextTables.REMOVED) continue
            if (kind == TextTables.WHITESPACE || kind == TextTables.SINGLE) {
                if (current != null) {
                    words.add(Word(current.toString(), start, end))
                    current = null
                }
                if (kind == TextTables.SINGLE) words.add(Word(CodePoints.string(codePoints, position, position + 1), position, position + 1))
                continue
            }
            if (current == null) {
                current = StringBuilder()
                start = position
            }
            current.appendCodePoint(c)
            end = position + 1
        }
        if (current != null) words.add(Word(current.toString(), start, end))
        return words
    }

    /**
     * Words, `[CLS] pieces [SEP]` cut to `sequenceLength` and padded, and the word of each
     * position (`align_word_labels`): a word whose first piece does not fit is counted in
     * `numTruncatedWords`; a word cut after its first piece keeps its tag.
     */
    @JvmStatic
    fun prepare(text: String, tokenizer: WordPieceTokenizer, tables: TextTables, stripAccents: Boolean, sequenceLength: Int): TaggerInputs {
        if (sequenceLength < 3) throw IllegalArgumentException("sequenceLength must be >= 3 ([CLS], a piece, [SEP]), got $sequenceLength")
        val words = splitWords(text, tables, stripAccents)
        val body = sequenceLength - 2
        val pieces = IntList()
        val pieceWords = IntList()
        var truncatedWords = 0
        for ((index, word) in words.withIndex()) {
            val ids = tokenizer.tokenize(word.text).ids
            if (ids.isNotEmpty() && pieces.size >= body) truncatedWords += 1
            for (id in ids) {
                pieces.add(id)
                pieceWords.add(index)
            }
        }
        val kept = minOf(pieces.size, body)
        val tokenIds = IntArray(sequenceLength) { tokenizer.padId }
        val mask = IntArray(sequenceLength)
        val wordIds = IntArray(sequenceLength) { -1 }
        tokenIds[0] = tokenizer.clsId
        for (i in 0 until kept) {
            tokenIds[i + 1] = pieces[i]
            wordIds[i + 1] = pieceWords[i]
        }
        tokenIds[kept + 1] = tokenizer.sepId
        for (i in 0 until kept + 2) mask[i] = 1
        val inputs = ModelInputs(tokenIds, IntArray(sequenceLength), mask, kept + 2, pieces.size - kept)
        return TaggerInputs(words, inputs, wordIds, truncatedWords)
    }

    /**
     * Word tags from the model's logits: the argmax (or, with `crf`, the Viterbi path over the
     * first pieces) at each word's first piece, "O" for words without a piece, then the IOB2
     * repair and the entity spans.
     *
     * @param logits `[position][label]` scores, at least the real positions.
     * @param labels the card's labels (IOB2 tags), in output order.
     * @param crf transitions of a CRF tagger, or `null` for argmax.
     * @param text the text `prepared` came from (for the spans' text).
     */
    @JvmStatic
    fun decode(prepared: TaggerInputs, logits: Array<DoubleArray>, labels: List<String>, crf: CrfTransitions?, text: String): Entities {
        val first = prepared.firstPiecePositions()
        for (p in first) {
            if (p >= logits.size || logits[p].size != labels.size) {
                throw IllegalArgumentException("logits must hold ${labels.size} scores for position $p " +
                    "(got ${logits.size} positions${if (p < logits.size) " of ${logits[p].size} scores" else ""})")
            }
        }
        val best: IntArray = if (crf == null) {
            IntArray(first.size) { Scores.argmax(logits[first[it]]) }
        } else {
            crf.viterbi(Array(first.size) { logits[first[it]] })
        }
        val tags = ArrayList<String?>()
        for (i in prepared.words.indices) tags.add(null)
        for (i in first.indices) tags[prepared.wordIds[first[i]]] = labels[best[i]]
        var filled = 0
        val complete = ArrayList<String>(tags.size)
        for (tag in tags) {
            if (tag == null) filled += 1
            complete.add(tag ?: "O")
        }
        val repaired = repairIob2(complete)
        val spans = entitySpans(repaired.first, prepared.words, text)
        return Entities(prepared.words, repaired.first, spans, filled, repaired.second)
    }

    /** True for "O", "B-TYPE" and "I-TYPE" (TYPE without whitespace). */
    @JvmStatic
    fun isIobTag(tag: String): Boolean {
        if (tag == "O") return true
        if (tag.length < 3 || (tag[0] != 'B' && tag[0] != 'I') || tag[1] != '-') return false
        for (c in tag.substring(2)) if (Character.isWhitespace(c)) return false
        return true
    }

    /**
     * The conlleval repair: an `I-X` that continues no `X` entity starts one
     * (`O I-X` -> `O B-X`, `B-X I-Y` -> `B-X B-Y`).
     *
     * @return the repaired tags and the number of repairs.
     */
    @JvmStatic
    fun repairIob2(tags: List<String>): Pair<List<String>, Int> {
        val repaired = ArrayList<String>(tags.size)
        var previousType: String? = null
        var repairs = 0
        for ((position, original) in tags.withIndex()) {
            if (!isIobTag(original)) {
                throw IllegalArgumentException("malformed tag \"$original\" at position $position: expected 'O', 'B-<TYPE>' or 'I-<TYPE>'")
            }
            var tag = original
            if (tag.startsWith("I-") && tag.substring(2) != previousType) {
                tag = "B-" + tag.substring(2)
                repairs += 1
            }
            repaired.add(tag)
            previousType = if (tag == "O") null else tag.substring(2)
        }
        return Pair(repaired, repairs)
    }

    /** Entities of strict IOB2 tags (`B-X` then any `I-X`) with the words' character spans. */
    @JvmStatic
    fun entitySpans(tags: List<String>, words: List<Word>, text: String): List<EntitySpan> {
        if (tags.size != words.size) throw IllegalArgumentException("need one tag per word: ${tags.size} tags, ${words.size} words")
        val spans = ArrayList<EntitySpan>()
        var start = -1
        var type = ""
        for (position in 0..tags.size) {
            val tag = if (position < tags.size) tags[position] else "O"
            if (!isIobTag(tag)) throw IllegalArgumentException("malformed tag \"$tag\" at position $position")
            if (start >= 0 && !(tag.startsWith("I-") && tag.substring(2) == type)) {
                val startChar = words[start].start
                val endChar = words[position - 1].end
                spans.add(EntitySpan(type, start, position, startChar, endChar, CodePoints.slice(text, startChar, endChar)))
                start = -1
            }
            if (tag.startsWith("B-")) {
                start = position
                type = tag.substring(2)
            }
        }
        return spans
    }
}
