package dev.kerasattn.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test

/** Asset checks: card fields, vocabulary size, labels and the model's tensor shapes. */
class ModelCardTest {
    private val tables = TextTables.load()

    private fun card(task: String = "ner", labels: String = "[\"O\", \"B-PER\", \"I-PER\"]", crf: String = "null",
                     length: Int = 8, lowercase: Boolean = true) = """
        {"format": "keras-attn model card 1", "task": "$task", "labels": $labels, "sequence_length": $length,
         "inputs": [{"name": "token_ids", "dtype": "int32", "shape": [1, $length]},
                    {"name": "segment_ids", "dtype": "int32", "shape": [1, $length]},
                    {"name": "padding_mask", "dtype": "int32", "shape": [1, $length]}],
         "tokenizer": {"vocabulary_size": 5, "lowercase": $lowercase, "strip_accents": $lowercase,
                       "cls_token_id": 2, "sep_token_id": 3, "pad_token_id": 0, "unknown_token_id": 1,
                       "max_word_bytes": 100},
         "crf": $crf}"""

    @Test
    fun readsTheFieldsTheAppNeeds() {
        val parsed = ModelCard.parse(card(crf = """{"transitions": [[0, 1, 2], [3, 4, 5], [6, 7, 8]],
            "start_transitions": [0, 0, 1], "end_transitions": [1, 0, 0]}"""))
        assertTrue(parsed.isTagger)
        assertEquals(8, parsed.sequenceLength)
        assertEquals(listOf("O", "B-PER", "I-PER"), parsed.labels)
        assertEquals(5.0, parsed.crf!!.transitions[1][2], 0.0)
        assertEquals(listOf("token_ids", "segment_ids", "padding_mask"), parsed.inputNames)
    }

    @Test
    fun mismatchedAssetsAreExplained() {
        val parsed = ModelCard.parse(card())
        assertEquals("vocab.txt has 4 tokens but the model card says vocabulary_size=5: copy vocab.txt from the same " +
            "export directory as the model",
            assetError { parsed.tokenizer(listOf("[PAD]", "[UNK]", "[CLS]", "[SEP]"), tables) })
        assertTrue(assetError { parsed.checkLabels(listOf("O", "B-PER")) }.startsWith("labels.txt (2 labels) differs"))
        parsed.checkLabels(listOf("O", "B-PER", "I-PER", ""))
        val shapes = mapOf("token_ids" to intArrayOf(1, 8), "segment_ids" to intArrayOf(1, 8), "padding_mask" to intArrayOf(1, 16))
        assertTrue(assetError { parsed.checkModelShapes(shapes, intArrayOf(1, 8, 3), "model_int8.tflite") }
            .startsWith("model_int8.tflite input \"padding_mask\" has shape [1, 16], the model card says [1, 8]"))
        val good = mapOf("token_ids" to intArrayOf(1, 8), "segment_ids" to intArrayOf(1, 8), "padding_mask" to intArrayOf(1, 8))
        parsed.checkModelShapes(good, intArrayOf(1, 8, 3), "m.tflite")
        assertTrue(assetError { parsed.checkModelShapes(good, intArrayOf(1, 8, 4), "m.tflite") }
            .startsWith("m.tflite output has shape [1, 8, 4], expected [1, 8, 3]"))
    }

    @Test
    fun badCardsAreRejected() {
        assertEquals("model_card.json: label \"PER\" is not an IOB2 tag (O, B-TYPE, I-TYPE)",
            assetError { ModelCard.parse(card(labels = "[\"O\", \"PER\"]")) })
        assertEquals("model_card.json: crf: 2 tags, but 3 labels", assetError {
            ModelCard.parse(card(crf = """{"transitions": [[0, 1], [2, 3]], "start_transitions": [0, 0], "end_transitions": [0, 0]}"""))
        })
        assertEquals("model_card.json: only a tagger can have \"crf\" transitions", assetError {
            ModelCard.parse(card(task = "classification", labels = "[\"a\", \"b\"]",
                crf = """{"transitions": [[0]], "start_transitions": [0], "end_transitions": [0]}"""))
        })
        assertEquals("model_card.json: sequence_length must be >= 3, got 2", assetError { ModelCard.parse(card(length = 2)) })
        assertEquals("model_card.json: task \"qa\" has no on-device pipeline (classification or ner)",
            assetError { ModelCard.parse(card(task = "qa")) })
    }

    @Test
    fun tablesReportMalformedLines() {
        val text = "table normalize_uncased 1\nR 41 26 1\nend\n"
        assertEquals("t.txt:2: bad line \"R 41 26 1\"",
            assetError { TextTables.read(text.byteInputStream(), "t.txt") })
        assertEquals("t.txt: no \"end\" line (truncated file?)",
            assetError { TextTables.read("table normalize_uncased 0\n".byteInputStream(), "t.txt") })
    }
}
