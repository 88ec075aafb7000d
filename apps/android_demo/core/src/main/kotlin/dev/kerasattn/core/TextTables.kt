package dev.kerasattn.core

import java.io.InputStream

/**
 * The per-code-point answers of the reference that the Kotlin tokenizer and word splitter
 * look up: HF `tokenizers`' `BertNormalizer` (uncased: clean text, NFD, nonspacing marks
 * dropped, lower-cased; cased: clean text only), `BertPreTokenizer`'s classes, and
 * `keras_attn.text.word_splitter`'s classes (see `tools/make_text_tables.py`, which measures
 * and writes them into `keras_attn/text/bert_text_tables.txt`; the build copies that file
 * onto the class path). The tables' `normalize_lowercase` / `normalize_strip_accents`
 * sections serve only the Python tokenizer's mixed modes and are not read here.
 *
 * Tables instead of `java.lang.Character` / `java.text.Normalizer`: those follow the Unicode
 * version of the JVM or of the phone's Android release, and neither has HF's Unicode data or
 * its CJK ranges; the tables make every device answer as the Python reference does.
 *
 * Example:
 * ```
 * val tables = TextTables.load()           // the copy bundled with this library
 * tables.normalize(0x00C9, lowercase = true).toList()  // "É" -> [0x65] ("e")
 * ```
 */
class TextTables private constructor(
    private val uncased: Map<Int, IntArray>,
    private val cased: Map<Int, IntArray>,
    private val hangulUncased: Boolean,
    private val tokenizerClasses: RunTable,
    private val wordClassesStripAccents: RunTable,
    private val wordClassesKeepAccents: RunTable
) {
    /**
     * What the reference normalizer makes of one code point: the code points it becomes
     * (empty when removed). CJK ideographs are not padded with spaces here: their class
     * ([tokenizerClass]) makes each a word. A lone UTF-16 surrogate (never in valid UTF-8)
     * is removed.
     *
     * @param codePoint the input code point.
     * @param lowercase uncased (lower-case, NFD, nonspacing marks dropped) or cased
     *     normalization (control characters removed, whitespace made a space).
     */
    fun normalize(codePoint: Int, lowercase: Boolean): IntArray {
        if (codePoint in 0xD800..0xDFFF) return EMPTY
        val map = if (lowercase) uncased else cased
        val mapped = map[codePoint]
        if (mapped != null) return mapped
        if (lowercase && hangulUncased && codePoint in HANGUL_FIRST..HANGUL_LAST) {
            return hangulDecomposition(codePoint)
        }
        return intArrayOf(codePoint)
    }

    /**
     * Pre-tokenization class of a normalized character: [WORD], [WHITESPACE] or [SINGLE]
     * (punctuation, CJK ideographs).
     */
    fun tokenizerClass(codePoint: Int): Int = tokenizerClasses.classOf(codePoint)

    /**
     * Word-splitter class of an original character: [WORD], [WHITESPACE], [REMOVED] or
     * [SINGLE] (`keras_attn.text.word_splitter.character_class`).
     */
    fun wordClass(codePoint: Int, stripAccents: Boolean): Int =
        (if (stripAccents) wordClassesStripAccents else wordClassesKeepAccents).classOf(codePoint)

    companion object {
        const val WORD = 0
        const val WHITESPACE = 1
        const val REMOVED = 2
        const val SINGLE = 3

        /**
         * Where the bundled tables are, as a class-path resource: the Python library's
         * `keras_attn/text/bert_text_tables.txt`, copied by the build (Gradle's
         * `processResources`, `run_jvm_tests.sh`).
         */
        const val RESOURCE = "/dev/kerasattn/core/bert_text_tables.txt"

        private val EMPTY = IntArray(0)
        private const val HANGUL_FIRST = 0xAC00
        private const val HANGUL_LAST = 0xD7A3
        private const val MAX_CODE_POINT = 0x10FFFF

        @Volatile
        private var bundled: TextTables? = null

        /** The tables bundled with the library (read once, then shared). */
        @JvmStatic
        fun load(): TextTables {
            val cached = bundled
            if (cached != null) return cached
            val stream = TextTables::class.java.getResourceAsStream(RESOURCE)
                ?: throw AssetException("$RESOURCE is not on the class path: the core library " +
                    "was packaged without it (its build copies the Python library's " +
                    "keras_attn/text/bert_text_tables.txt there)")
            val tables = stream.use { read(it, RESOURCE) }
            bundled = tables
            return tables
        }

        /**
         * Reads tables in the format of `make_text_tables.py`.
         *
         * @param input the table file (ASCII).
         * @param source its name for error messages.
         * @throws AssetException naming `source:line` on malformed content.
         */
        @JvmStatic
        fun read(input: InputStream, source: String): TextTables {
            val lines = input.bufferedReader(Charsets.US_ASCII).readLines()
            val sections = HashMap<String, List<IndexedValue<String>>>()
            var current: MutableList<IndexedValue<String>>? = null
            var expected = 0
            var name = ""
            var ended = false
            for ((index, line) in lines.withIndex()) {
                if (line.startsWith("#") || line.length == 0) continue
                if (ended) throw AssetException("$source:${index + 1}: text after \"end\"")
                if (line.startsWith("table ") || line == "end") {
                    if (current != null && current.size != expected) {
                        throw AssetException("$source:${index + 1}: table $name has ${current.size} " +
                            "lines, its header says $expected (truncated file?)")
                    }
                    if (line == "end") {
                        ended = true
                        continue
                    }
                    val parts = line.split(" ")
                    if (parts.size != 3) throw AssetException("$source:${index + 1}: bad table header \"$line\"")
                    name = parts[1]
                    expected = parts[2].toIntOrNull()
                        ?: throw AssetException("$source:${index + 1}: bad line count in \"$line\"")
                    current = ArrayList()
                    sections[name] = current
                    continue
                }
                if (current == null) throw AssetException("$source:${index + 1}: line outside a table")
                current.add(IndexedValue(index + 1, line))
            }
            if (!ended) throw AssetException("$source: no \"end\" line (truncated file?)")
            fun section(key: String): List<IndexedValue<String>> =
                sections[key] ?: throw AssetException("$source: table \"$key\" is missing")

            val uncased = HashMap<Int, IntArray>()
            val hangul = readNormalization(section("normalize_uncased"), uncased, source)
            val cased = HashMap<Int, IntArray>()
            readNormalization(section("normalize_cased"), cased, source)
            return TextTables(
                uncased, cased, hangul,
                readRuns(section("tokenizer_classes"), "WSP", source),
                readRuns(section("word_classes_strip_accents"), "WSRP", source),
                readRuns(section("word_classes_keep_accents"), "WSRP", source)
            )
        }

        private fun hex(text: String, source: String, line: Int): Int {
            val value = try {
                Integer.parseInt(text, 16)
            } catch (e: NumberFormatException) {
                throw AssetException("$source:$line: \"$text\" is not a hexadecimal code point")
            }
            if (value < 0 || value > MAX_CODE_POINT) throw AssetException("$source:$line: U+$text is out of range")
            return value
        }

        private fun decimal(text: String, source: String, line: Int): Int =
            text.toIntOrNull() ?: throw AssetException("$source:$line: \"$text\" is not an integer")

        /** Fills `map` from R/T/E/M lines; returns whether Hangul syllables decompose (H). */
        private fun readNormalization(lines: List<IndexedValue<String>>, map: HashMap<Int, IntArray>, source: String): Boolean {
            var hangul = false
            for ((number, line) in lines) {
                val parts = line.split(" ")
                when (parts[0]) {
                    "H" -> hangul = true
                    "M" -> {
                        if (parts.size < 2) throw AssetException("$source:$number: bad line \"$line\"")
                        val out = IntArray(parts.size - 2)
                        for (i in out.indices) out[i] = hex(parts[i + 2], source, number)
                        map[hex(parts[1], source, number)] = out
                    }
                    "R", "T", "E" -> {
                        if (parts.size != (if (parts[0] == "E") 4 else 5)) {
                            throw AssetException("$source:$number: bad line \"$line\"")
                        }
                        val start = hex(parts[1], source, number)
                        val count = decimal(parts[2], source, number)
                        val step = decimal(parts[3], source, number)
                        for (i in 0 until count) {
                            val code = start + i * step
                            map[code] = when (parts[0]) {
                                "R" -> intArrayOf(code + decimal(parts[4], source, number))
                                "T" -> intArrayOf(hex(parts[4], source, number))
                                else -> EMPTY
                            }
                        }
                    }
                    else -> throw AssetException("$source:$number: unknown line \"$line\"")
                }
            }
            return hangul
        }

        private fun readRuns(lines: List<IndexedValue<String>>, letters: String, source: String): RunTable {
            val starts = IntArray(lines.size)
            val classes = IntArray(lines.size)
            for ((i, entry) in lines.withIndex()) {
                val parts = entry.value.split(" ")
                if (parts.size != 3 || parts[0] != "C" || parts[2].length != 1 || letters.indexOf(parts[2][0]) < 0) {
                    throw AssetException("$source:${entry.index}: bad class line \"${entry.value}\"")
                }
                starts[i] = hex(parts[1], source, entry.index)
                if (i > 0 && starts[i] <= starts[i - 1]) {
                    throw AssetException("$source:${entry.index}: class runs must be in increasing order")
                }
                // Letters of a table map onto WORD, WHITESPACE, REMOVED, SINGLE.
                classes[i] = when (parts[2][0]) {
                    'W' -> WORD
                    'S' -> WHITESPACE
                    'R' -> REMOVED
                    else -> SINGLE
                }
            }
            if (starts.isEmpty() || starts[0] != 0) throw AssetException("$source: a class table must start at U+0000")
            return RunTable(starts, classes)
        }

        /** Canonical decomposition of a precomposed Hangul syllable (Unicode section 3.12). */
        private fun hangulDecomposition(codePoint: Int): IntArray {
            val index = codePoint - HANGUL_FIRST
            val lead = 0x1100 + index / 588
            val vowel = 0x1161 + (index % 588) / 28
            val trail = index % 28
            return if (trail == 0) intArrayOf(lead, vowel) else intArrayOf(lead, vowel, 0x11A7 + trail)
        }
    }

    /** Run-length classes: code points `starts[i]` up to `starts[i + 1] - 1` have `classes[i]`. */
    private class RunTable(private val starts: IntArray, private val classes: IntArray) {
        fun classOf(codePoint: Int): Int {
            var low = 0
            var high = starts.size - 1
            while (low < high) {  // the last run starting at or before codePoint
                val middle = (low + high + 1) ushr 1
                if (starts[middle] <= codePoint) low = middle else high = middle - 1
            }
            return classes[low]
        }
    }
}

/** A model asset (vocabulary, labels, model card, tables, model file) is missing or wrong. */
class AssetException(message: String) : IllegalArgumentException(message)
