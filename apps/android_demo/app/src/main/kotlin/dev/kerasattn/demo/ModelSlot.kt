package dev.kerasattn.demo

import android.content.res.AssetManager
import dev.kerasattn.core.AssetException
import dev.kerasattn.core.Bucket
import dev.kerasattn.core.Entities
import dev.kerasattn.core.LengthBuckets
import dev.kerasattn.core.ModelAssets
import dev.kerasattn.core.ModelCard
import dev.kerasattn.core.ModelFile
import dev.kerasattn.core.Ner
import dev.kerasattn.core.Scores
import dev.kerasattn.core.TextTables
import dev.kerasattn.core.WordPieceTokenizer
import org.tensorflow.lite.Interpreter
import java.io.FileInputStream
import java.io.FileNotFoundException
import java.nio.MappedByteBuffer
import java.nio.channels.FileChannel

/** Milliseconds of the three stages of one request, as shown under the result. */
data class Latency(val tokenizeMs: Double, val modelMs: Double, val decodeMs: Double, val threads: Int) {
    val totalMs: Double get() = tokenizeMs + modelMs + decodeMs
}

/** A classifier's answer: the label, every label's probability, the pieces cut, the timing. */
data class Classification(
    val label: String,
    val probabilities: List<Pair<String, Double>>,
    val numTokens: Int,
    val numTruncated: Int,
    val latency: Latency,
)

/** A tagger's answer: tags and entity spans, how many words were cut, the timing. */
data class Tagging(val entities: Entities, val numTruncatedWords: Int, val latency: Latency)

/**
 * One exported model in `assets/<folder>/` (`model.tflite`, copied by the `copyModelAssets`
 * Gradle task), checked against its card when loaded, and run with the LiteRT Interpreter
 * (XNNPACK on the CPU). The card, vocabulary and labels come from the model file itself
 * ([ModelFile]: the TFLite metadata's associated files), or from `model_card.json`,
 * `vocab.txt` and `labels.txt` beside it for exports without metadata.
 *
 * A file with length buckets (`model_<variant>_buckets.tflite`: one signature per length)
 * runs each text on the shortest signature that holds its tokens ([LengthBuckets]); a
 * fixed-length file has one signature, which every text runs on.
 *
 * Not thread-safe: the activity calls it from its single inference thread only.
 *
 * @param assets the app's assets.
 * @param folder `classify` or `entities`.
 * @param threads CPU threads of the interpreter.
 * @throws AssetException when a file is missing or the files do not belong together.
 */
class ModelSlot(assets: AssetManager, val folder: String, val threads: Int) : AutoCloseable {
    val card: ModelCard
    val variant: String
    private val tables = TextTables.load()
    private val tokenizer: WordPieceTokenizer
    private val interpreter: Interpreter
    private val buckets: LengthBuckets
    private val outputName: String

    init {
        val model = mapModel(assets, "$folder/model.tflite")
        // A self-describing model file carries its card, vocabulary and labels; older exports
        // need the side files beside it.
        val embedded = ModelFile.associatedFiles(model, "$folder/model.tflite")
        val described = if (ModelFile.CARD in embedded) {
            ModelFile.assets(model, tables, "$folder/model.tflite")
        } else {
            sideFiles(assets)
        }
        card = described.card
        tokenizer = described.tokenizer
        val expectedTask = if (folder == "entities") "ner" else "classification"
        if (card.task != expectedTask) {
            throw AssetException("$folder/model.tflite is a ${card.task} model, this tab needs $expectedTask: " +
                "copy the export directories again with copyModelAssets")
        }
        variant = try {
            readText(assets, "model_variant.txt").trim()
        } catch (e: AssetException) {
            "unknown variant"
        }
        val options = Interpreter.Options().setNumThreads(threads).setUseXNNPACK(true)
        interpreter = Interpreter(model, options)
        try {
            // One signature (a fixed-length file) or one per length bucket; the longest
            // (`serving_default`) is checked against the card.
            buckets = LengthBuckets(interpreter.signatureKeys.associate {
                it to interpreter.getInputTensorFromSignature("token_ids", it).shape()[1]
            })
            val signature = buckets.longest.signature
            val inputShapes = interpreter.getSignatureInputs(signature).associateWith {
                interpreter.getInputTensorFromSignature(it, signature).shape()
            }
            val outputs = interpreter.getSignatureOutputs(signature)
            outputName = outputs.firstOrNull { it == "logits" } ?: outputs.first()
            card.checkModelShapes(inputShapes, interpreter.getOutputTensorFromSignature(outputName, signature).shape(),
                "$folder/model.tflite")
        } catch (e: AssetException) {
            interpreter.close()
            throw e
        } catch (e: IllegalArgumentException) {  // a signature without token_ids
            interpreter.close()
            throw AssetException("$folder/model.tflite: ${e.message}")
        }
    }

    /** Label and probabilities of `text` (classification models). */
    fun classify(text: String): Classification {
        val t0 = System.nanoTime()
        val inputs = tokenizer.encode(text, card.sequenceLength)
        val t1 = System.nanoTime()
        val logits = Array(1) { FloatArray(card.labels.size) }
        run(inputs.tokenIds, inputs.segmentIds, inputs.paddingMask, buckets.pick(inputs.length), logits)
        val t2 = System.nanoTime()
        val scores = Scores.toDoubles(logits[0])
        val probabilities = Scores.softmax(scores)
        val order = Scores.topK(probabilities, probabilities.size)
        val t3 = System.nanoTime()
        return Classification(
            card.labels[order[0]], order.map { card.labels[it] to probabilities[it] }, inputs.length,
            inputs.numTruncated, Latency(ms(t0, t1), ms(t1, t2), ms(t2, t3), threads))
    }

    /** Entity spans of `text` (tagger models; CRF transitions from the card when it has them). */
    fun tag(text: String): Tagging {
        val t0 = System.nanoTime()
        val prepared = Ner.prepare(text, tokenizer, tables, card.stripAccents, card.sequenceLength)
        val t1 = System.nanoTime()
        val bucket = buckets.pick(prepared.inputs.length)
        val logits = Array(1) { Array(bucket.length) { FloatArray(card.labels.size) } }
        run(prepared.inputs.tokenIds, prepared.inputs.segmentIds, prepared.inputs.paddingMask, bucket, logits)
        val t2 = System.nanoTime()
        val scores = Array(prepared.inputs.length) { Scores.toDoubles(logits[0][it]) }
        val entities = Ner.decode(prepared, scores, card.labels, card.crf, text)
        val t3 = System.nanoTime()
        return Tagging(entities, prepared.numTruncatedWords, Latency(ms(t0, t1), ms(t1, t2), ms(t2, t3), threads))
    }

    /** Runs the inputs, cut to `bucket`'s length (only padding is cut), on its signature. */
    private fun run(tokenIds: IntArray, segmentIds: IntArray, paddingMask: IntArray, bucket: Bucket, output: Any) {
        val byName = mapOf("token_ids" to tokenIds, "segment_ids" to segmentIds, "padding_mask" to paddingMask)
        val inputs = HashMap<String, Any>()
        for (name in card.inputNames) {
            val ids = byName[name] ?: throw AssetException("unknown input $name")
            inputs[name] = arrayOf(LengthBuckets.cut(ids, bucket.length))
        }
        interpreter.runSignature(inputs, mapOf(outputName to output), bucket.signature)
    }

    override fun close() = interpreter.close()

    private fun sideFiles(assets: AssetManager): ModelAssets {
        val card = ModelCard.parse(readText(assets, "model_card.json"), "$folder/model_card.json")
        val vocabulary = readText(assets, "vocab.txt").lines().dropLastWhile { it.isEmpty() }
        val tokenizer = card.tokenizer(vocabulary, tables, "$folder/vocab.txt")
        card.checkLabels(readText(assets, "labels.txt").lines(), "$folder/labels.txt")
        return ModelAssets(card, vocabulary, tokenizer)
    }

    private fun readText(assets: AssetManager, name: String): String = try {
        assets.open("$folder/$name").use { it.readBytes().toString(Charsets.UTF_8) }
    } catch (e: FileNotFoundException) {
        throw AssetException("assets/$folder/$name is missing: build the app after " +
            "`./gradlew :app:copyModelAssets -PartifactDir=EXPORT_DIR` (see apps/android_demo/README.md)")
    }

    private fun mapModel(assets: AssetManager, path: String): MappedByteBuffer {
        val descriptor = try {
            assets.openFd(path)
        } catch (e: FileNotFoundException) {
            throw AssetException("assets/$path is missing (or compressed in the APK): run copyModelAssets and keep " +
                "`noCompress += \"tflite\"` in app/build.gradle.kts")
        }
        return descriptor.use {
            FileInputStream(it.fileDescriptor).channel.use { channel ->
                channel.map(FileChannel.MapMode.READ_ONLY, it.startOffset, it.declaredLength)
            }
        }
    }

    private fun ms(from: Long, to: Long) = (to - from) / 1e6
}
