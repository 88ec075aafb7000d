package dev.kerasattn.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test
import java.io.File

/**
 * Kotlin == Python on every golden record written by the export stage
 * (`keras_attn.export.golden_vectors`): for each model directory under the golden root
 * (`-Dgolden.root=DIR` or `$GOLDEN_ROOT`; every directory holding `model_card.json` and
 * `golden_vectors.jsonl`, the root itself included), the text alone must give the recorded
 * ids, offsets, words, word ids and truncation counts, and the recorded logits must decode to
 * the recorded label and probabilities (within 1e-6, the rounding of the file) or word tags
 * and entity spans. Prints, per directory, the sentences compared and the mismatches.
 */
class GoldenParityTest {
    private val tables = TextTables.load()

    private fun goldenRoot(): File {
        val path = System.getProperty("golden.root") ?: System.getenv("GOLDEN_ROOT")
            ?: throw AssertionError("no golden vectors: run with -Dgolden.root=DIR (or GOLDEN_ROOT=DIR), DIR written by " +
                "apps/android_demo/tools/make_golden_vectors.py or `keras-attn export`")
        val root = File(path)
        if (!root.isDirectory) throw AssertionError("golden root $root is not a directory")
        return root
    }

    private fun modelDirectories(root: File): List<File> {
        val found = ArrayList<File>()
        if (File(root, "model_card.json").isFile) found.add(root)
        val children = root.listFiles() ?: arrayOf()
        for (child in children.sortedBy { it.name }) {
            if (File(child, "model_card.json").isFile && File(child, "golden_vectors.jsonl").isFile) found.add(child)
        }
        return found
    }

    @Test
    fun everyGoldenRecordIsReproduced() {
        val root = goldenRoot()
        val directories = modelDirectories(root)
        assertTrue("no model directories with model_card.json + golden_vectors.jsonl under $root", directories.isNotEmpty())
        var totalMismatches = 0
        val report = StringBuilder()
        for (directory in directories) {
            val suite = Suite(directory, tables)
            suite.run()
            val line = "golden parity ${directory.name} (${suite.card.task}${if (suite.card.crf != null) ", CRF" else ""}, " +
                "${if (suite.card.lowercase) "uncased" else "cased"}): ${suite.compared} sentences compared, " +
                "${suite.mismatches.size} mismatches"
            println(line)
            for (mismatch in suite.mismatches.take(10)) println("  $mismatch")
            report.append(line).append('\n')
            for (mismatch in suite.mismatches.take(10)) report.append("  ").append(mismatch).append('\n')
            assertTrue("${directory.name}: no records", suite.compared > 0)
            totalMismatches += suite.mismatches.size
        }
        assertEquals("Kotlin differs from Python:\n$report", 0, totalMismatches)
    }

    /** One model directory: its assets and the comparison of every record. */
    private class Suite(val directory: File, val tables: TextTables) {
        val card = ModelCard.parse(File(directory, "model_card.json").readText(Charsets.UTF_8), "${directory.name}/model_card.json")
        val tokenizer = card.tokenizer(File(directory, "vocab.txt").readLines(Charsets.UTF_8), tables, "${directory.name}/vocab.txt")
        val mismatches = ArrayList<String>()
        var compared = 0

        init {
            card.checkLabels(File(directory, "labels.txt").readLines(Charsets.UTF_8), "${directory.name}/labels.txt")
        }

        fun run() {
            var number = 0
            File(directory, "golden_vectors.jsonl").forEachLine(Charsets.UTF_8) { line ->
                number += 1
                val where = "${directory.name}/golden_vectors.jsonl:$number"
                val record = Json.parse(line, where) as Map<*, *>
                val text = Json.stringField(record, "text", where)
                val before = mismatches.size
                if (card.isTagger) compareTagger(record, text, where) else compareClassifier(record, text, where)
                if (mismatches.size > before) {
                    mismatches[before] = mismatches[before] + "  text=" + escape(text)
                }
                compared += 1
            }
        }

        private fun check(where: String, field: String, expected: Any?, actual: Any?): Boolean {
            if (expected == actual) return true
            mismatches.add("$where $field: python=$expected kotlin=$actual")
            return false
        }

        private fun ints(record: Map<*, *>, key: String, where: String): List<Int> =
            Json.toIntArray(Json.listField(record, key, where), "$where $key").toList()

        private fun compareClassifier(record: Map<*, *>, text: String, where: String) {
            val pieces = tokenizer.tokenize(text)
            val inputs = tokenizer.pack(pieces.ids, card.sequenceLength)
            check(where, "token_ids", ints(record, "token_ids", where), inputs.tokenIds.take(inputs.length))
            check(where, "piece_starts", ints(record, "piece_starts", where), pieces.starts.toList())
            check(where, "piece_ends", ints(record, "piece_ends", where), pieces.ends.toList())
            val logits = Json.toDoubleArray(Json.listField(record, "logits", where), "$where logits")
            check(where, "label", Json.stringField(record, "label", where), card.labels[Scores.argmax(logits)])
            val expected = Json.toDoubleArray(Json.listField(record, "probabilities", where), "$where probabilities")
            val actual = Scores.softmax(logits)
            if (expected.size != actual.size) {
                check(where, "probabilities", expected.toList(), actual.toList())
            } else {
                for (i in expected.indices) {
                    if (Math.abs(expected[i] - actual[i]) > 1e-6) {
                        check(where, "probabilities", expected.toList(), actual.toList())
                        break
                    }
                }
            }
        }

        private fun compareTagger(record: Map<*, *>, text: String, where: String) {
            val prepared = Ner.prepare(text, tokenizer, tables, card.stripAccents, card.sequenceLength)
            val expectedWords = Json.listField(record, "words", where).map { entry ->
                val triple = entry as List<*>
                "${triple[0]}@${Json.toInt(triple[1], where)}-${Json.toInt(triple[2], where)}"
            }
            check(where, "words", expectedWords, prepared.words.map { "${it.text}@${it.start}-${it.end}" })
            val length = prepared.inputs.length
            check(where, "token_ids", ints(record, "token_ids", where), prepared.inputs.tokenIds.take(length))
            check(where, "word_ids", ints(record, "word_ids", where), prepared.wordIds.take(length))
            check(where, "num_truncated_words", Json.intField(record, "num_truncated_words", where), prepared.numTruncatedWords)
            val rows = Json.listField(record, "logits", where)
            val logits = Array(rows.size) { Json.toDoubleArray(rows[it], "$where logits[$it]") }
            if (rows.size != length) {
                check(where, "logits rows", length, rows.size)
                return
            }
            val entities = Ner.decode(prepared, logits, card.labels, card.crf, text)
            val expectedTags = Json.listField(record, "word_tags", where).map { it as String }
            check(where, "word_tags", expectedTags, entities.tags)
            val expectedSpans = Json.listField(record, "entities", where).map { entry ->
                val span = entry as Map<*, *>
                "${Json.stringField(span, "type", where)}[${Json.intField(span, "start_char", where)}, " +
                    "${Json.intField(span, "end_char", where)}) \"${Json.stringField(span, "text", where)}\""
            }
            check(where, "entities", expectedSpans, entities.spans.map { it.toString() })
        }

        private fun escape(text: String): String {
            val out = StringBuilder("\"")
            var i = 0
            while (i < text.length) {
                val c = text.codePointAt(i)
                if (c in 0x20..0x7E) out.appendCodePoint(c) else out.append(String.format("\\u{%X}", c))
                i += Character.charCount(c)
                if (out.length > 160) {
                    out.append("...")
                    break
                }
            }
            return out.append('"').toString()
        }
    }
}
