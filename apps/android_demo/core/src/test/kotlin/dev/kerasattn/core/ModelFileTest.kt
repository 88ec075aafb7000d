package dev.kerasattn.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test
import java.io.ByteArrayOutputStream
import java.io.File
import java.nio.ByteBuffer
import java.util.zip.ZipEntry
import java.util.zip.ZipOutputStream

/** The card, vocabulary and labels read from a model file's embedded zip ([ModelFile]). */
class ModelFileTest {
    private val tables = TextTables.load()
    private val card = """
        {"format": "keras-attn model card 1", "task": "classification", "labels": ["neg", "pos"],
         "sequence_length": 8,
         "inputs": [{"name": "token_ids", "dtype": "int32", "shape": [1, 8]},
                    {"name": "segment_ids", "dtype": "int32", "shape": [1, 8]},
                    {"name": "padding_mask", "dtype": "int32", "shape": [1, 8]}],
         "tokenizer": {"vocabulary_size": 6, "lowercase": true, "strip_accents": true,
                       "cls_token_id": 2, "sep_token_id": 3, "pad_token_id": 0, "unknown_token_id": 1,
                       "max_word_bytes": 100},
         "crf": null}"""
    private val vocabulary = "[PAD]\n[UNK]\n[CLS]\n[SEP]\ngood\ncafe\n"

    /** A flatbuffer-like prefix, then a zip whose offsets count from the zip's start (deflated). */
    private fun modelFile(files: Map<String, String>, prefix: String = "\u0008\u0000\u0000\u0000TFL3 model bytes"): ByteBuffer {
        val zip = ByteArrayOutputStream()
        ZipOutputStream(zip).use { out ->
            for ((name, text) in files) {
                out.putNextEntry(ZipEntry(name))
                out.write(text.toByteArray(Charsets.UTF_8))
                out.closeEntry()
            }
        }
        return ByteBuffer.wrap(prefix.toByteArray(Charsets.ISO_8859_1) + zip.toByteArray())
    }

    @Test
    fun readsTheEmbeddedCardVocabularyAndLabels() {
        val model = modelFile(mapOf("model_card.json" to card, "vocab.txt" to vocabulary, "labels.txt" to "neg\npos\n"))
        val assets = ModelFile.assets(model, tables)
        assertEquals(listOf("neg", "pos"), assets.card.labels)
        assertEquals(8, assets.card.sequenceLength)
        assertEquals(6, assets.vocabulary.size)
        assertEquals(listOf(2, 5, 4, 3), assets.tokenizer.encode("Café GOOD", 8).tokenIds.take(4))
    }

    @Test
    fun filesWithoutEmbeddedFilesOrWithBadOnesAreClearErrors() {
        assertEquals(emptyMap<String, ByteArray>(), ModelFile.associatedFiles(ByteBuffer.wrap(ByteArray(64))))
        assertTrue(assetError { ModelFile.assets(ByteBuffer.wrap("not a model".toByteArray()), tables) }
            .contains("not a TFLite file"))
        val noLabels = modelFile(mapOf("model_card.json" to card, "vocab.txt" to vocabulary))
        assertTrue(assetError { ModelFile.assets(noLabels, tables) }.contains("embeds no labels.txt"))
        val otherLabels = modelFile(mapOf("model_card.json" to card, "vocab.txt" to vocabulary, "labels.txt" to "a\nb\n"))
        assertTrue(assetError { ModelFile.assets(otherLabels, tables) }.contains("differs from the model card"))
    }

    /** Python's zip layout (`tflite_metadata.append_associated_files`, offsets from the file start,
     * entries stored), written by make_golden_vectors.py beside each golden model's side files. */
    @Test
    fun pythonEmbeddedFilesEqualTheSideFiles() {
        val root = File(System.getProperty("golden.root") ?: System.getenv("GOLDEN_ROOT") ?: return)
        val directories = (root.listFiles() ?: arrayOf()).filter { File(it, "embedded_files.tflite").isFile }
        assertTrue("no embedded_files.tflite under $root", directories.isNotEmpty())
        for (directory in directories) {
            val embedded = ModelFile.assets(ByteBuffer.wrap(File(directory, "embedded_files.tflite").readBytes()), tables)
            val side = ModelCard.parse(File(directory, "model_card.json").readText(), "model_card.json")
            assertEquals(side.labels, embedded.card.labels)
            assertEquals(side.lowercase, embedded.card.lowercase)
            assertEquals(side.sequenceLength, embedded.card.sequenceLength)
            assertEquals(side.crf?.transitions?.map { it.toList() }, embedded.card.crf?.transitions?.map { it.toList() })
            assertEquals(File(directory, "vocab.txt").readLines(), embedded.vocabulary)
            println("model file parity ${directory.name}: card, ${embedded.vocabulary.size} tokens, labels equal")
        }
    }
}
