package dev.kerasattn.core

import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.util.zip.Inflater

/**
 * What a self-describing keras-attn `.tflite` file carries (written by
 * `keras_attn.export.tflite_metadata.embed_metadata`): its model card, vocabulary and labels,
 * so the file alone is enough to tokenize, run and decode.
 *
 * A `.tflite` file with TFLite metadata is the model flatbuffer (file identifier `TFL3` at
 * byte 4) followed by a zip archive of its associated files (`model_card.json`, `vocab.txt`,
 * `labels.txt`), the layout of the TFLite metadata convention. The zip's end record is at the
 * end of the file, so the files are found from there, as any zip reader does; entry offsets
 * are taken relative to where the central directory really is, which also reads archives whose
 * offsets count from the start of the zip rather than of the file. Stored and deflated entries
 * are read.
 *
 * Example:
 * ```
 * val assets = ModelFile.assets(ByteBuffer.wrap(File("model_int8.tflite").readBytes()), TextTables.load())
 * assets.card.labels              // from the embedded model_card.json
 * assets.tokenizer.encode("a good film", assets.card.sequenceLength)
 * ```
 */
object ModelFile {
    const val CARD = "model_card.json"
    const val VOCABULARY = "vocab.txt"
    const val LABELS = "labels.txt"
    private const val END_RECORD = 0x06054b50
    private const val CENTRAL_ENTRY = 0x02014b50
    private const val LOCAL_ENTRY = 0x04034b50

    /** True when `model` starts like a TFLite flatbuffer (`TFL3` identifier). */
    @JvmStatic
    fun isTFLite(model: ByteBuffer): Boolean {
        if (model.limit() < 8) return false
        return (4 until 8).map { model.get(it).toChar() }.joinToString("") == "TFL3"
    }

    /**
     * The files packed into a `.tflite` file: name -> bytes; empty when it carries none.
     *
     * @param model the whole file (position and limit are ignored; absolute reads only).
     * @param source file name for messages.
     * @throws AssetException when the archive is damaged or uses another compression.
     */
    @JvmStatic
    fun associatedFiles(model: ByteBuffer, source: String = "model.tflite"): Map<String, ByteArray> {
        val bytes = model.duplicate().order(ByteOrder.LITTLE_ENDIAN)
        val size = bytes.capacity()
        var end = -1
        var p = size - 22
        while (p >= maxOf(0, size - 22 - 0xFFFF)) {
            if (bytes.getInt(p) == END_RECORD) { end = p; break }
            p--
        }
        if (end < 0) return emptyMap()
        val count = u16(bytes, end + 10)
        val directorySize = u32(bytes, end + 12)
        val shift = end - directorySize - u32(bytes, end + 16)  // prefix bytes before the zip
        val files = LinkedHashMap<String, ByteArray>()
        var entry = end - directorySize
        repeat(count) {
            if (entry < 0 || bytes.getInt(entry) != CENTRAL_ENTRY) throw AssetException("$source: damaged zip directory of the embedded files")
            val method = u16(bytes, entry + 10)
            val packedSize = u32(bytes, entry + 20)
            val fileSize = u32(bytes, entry + 24)
            val nameLength = u16(bytes, entry + 28)
            val name = String(slice(bytes, entry + 46, nameLength), Charsets.UTF_8)
            val local = u32(bytes, entry + 42) + shift
            if (local < 0 || bytes.getInt(local) != LOCAL_ENTRY) throw AssetException("$source: damaged zip entry $name")
            val data = slice(bytes, local + 30 + u16(bytes, local + 26) + u16(bytes, local + 28), packedSize)
            files[name] = when (method) {
                0 -> data
                8 -> inflate(data, fileSize, "$source: $name")
                else -> throw AssetException("$source: $name uses zip compression method $method (stored or deflated expected)")
            }
            entry += 46 + nameLength + u16(bytes, entry + 30) + u16(bytes, entry + 32)
        }
        return files
    }

    /**
     * The card, vocabulary and tokenizer embedded in a keras-attn `.tflite` file, checked as
     * the side files are ([ModelCard.tokenizer], [ModelCard.checkLabels]).
     *
     * @throws AssetException when the file embeds no model card, or the files disagree.
     */
    @JvmStatic
    fun assets(model: ByteBuffer, tables: TextTables, source: String = "model.tflite"): ModelAssets {
        if (!isTFLite(model)) throw AssetException("$source is not a TFLite file (no TFL3 identifier)")
        val files = associatedFiles(model, source)
        for (name in listOf(CARD, VOCABULARY, LABELS)) {
            if (name !in files) {
                throw AssetException("$source embeds no $name (files: ${files.keys}): export it again with `keras-attn " +
                    "export`, which embeds the card, vocabulary and labels in every model_<variant>.tflite, or copy " +
                    "the side files beside it")
            }
        }
        fun lines(name: String) = String(files.getValue(name), Charsets.UTF_8).split("\n").dropLastWhile { it.isEmpty() }
        val card = ModelCard.parse(String(files.getValue(CARD), Charsets.UTF_8), "$source:$CARD")
        val vocabulary = lines(VOCABULARY)
        val tokenizer = card.tokenizer(vocabulary, tables, "$source:$VOCABULARY")
        card.checkLabels(lines(LABELS), "$source:$LABELS")
        return ModelAssets(card, vocabulary, tokenizer)
    }

    private fun u16(bytes: ByteBuffer, at: Int) = bytes.getShort(at).toInt() and 0xFFFF

    private fun u32(bytes: ByteBuffer, at: Int): Int {
        val value = bytes.getInt(at).toLong() and 0xFFFFFFFFL
        if (value > Int.MAX_VALUE) throw AssetException("zip field at $at is too large ($value)")
        return value.toInt()
    }

    private fun slice(bytes: ByteBuffer, at: Int, length: Int): ByteArray {
        if (at < 0 || length < 0 || at + length > bytes.capacity()) throw AssetException("zip entry outside the file")
        val out = ByteArray(length)
        for (i in 0 until length) out[i] = bytes.get(at + i)
        return out
    }

    private fun inflate(data: ByteArray, size: Int, where: String): ByteArray {
        val inflater = Inflater(true)
        try {
            inflater.setInput(data)
            val out = ByteArray(size)
            var filled = 0
            while (filled < size && !inflater.finished()) {
                val n = inflater.inflate(out, filled, size - filled)
                if (n == 0 && (inflater.needsInput() || inflater.needsDictionary())) break
                filled += n
            }
            if (filled != size) throw AssetException("$where: deflated data gives $filled bytes, the zip says $size")
            return out
        } finally {
            inflater.end()
        }
    }
}

/** The card, vocabulary and tokenizer of a model, from its file or its side files. */
class ModelAssets(val card: ModelCard, val vocabulary: List<String>, val tokenizer: WordPieceTokenizer)
