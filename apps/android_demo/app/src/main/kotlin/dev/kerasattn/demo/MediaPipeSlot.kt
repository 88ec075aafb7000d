package dev.kerasattn.demo

import android.content.Context
import com.google.mediapipe.tasks.core.BaseOptions
import com.google.mediapipe.tasks.text.textclassifier.TextClassifier
import dev.kerasattn.core.AssetException

/**
 * The classifier's second engine: MediaPipe Tasks' `TextClassifier` on
 * `assets/classify/model_mediapipe.tflite` (`model_int8_mediapipe.tflite` or its fp32 twin of
 * `keras-attn export`: softmax in the graph, BERT tokenizer metadata, labels on the output).
 * MediaPipe tokenizes, runs and decodes in its C++ core; its tokenizer lower-cases ASCII only and
 * strips no accents, so texts with accented or non-Latin letters can score differently from the
 * LiteRT engine (docs/android.md).
 *
 * Not thread-safe: the activity calls it from its single inference thread only.
 */
class MediaPipeSlot(context: Context, val threads: Int) : AutoCloseable {
    private val classifier: TextClassifier

    init {
        if (!context.assets.list("classify").orEmpty().contains(MODEL)) {
            throw AssetException("assets/classify/$MODEL is missing: export a classifier with the mediapipe extra " +
                "installed and run copyModelAssets (see apps/android_demo/README.md)")
        }
        val options = TextClassifier.TextClassifierOptions.builder()
            .setBaseOptions(BaseOptions.builder().setModelAssetPath("classify/$MODEL").build())
            .build()
        classifier = TextClassifier.createFromOptions(context, options)
    }

    /** Label and probabilities of `text`; the whole call is timed as the model stage. */
    fun classify(text: String): Classification {
        val start = System.nanoTime()
        val result = classifier.classify(text)
        val elapsedMs = (System.nanoTime() - start) / 1e6
        val categories = result.classificationResult().classifications()[0].categories()
            .sortedByDescending { it.score() }
        return Classification(categories[0].categoryName(),
            categories.map { it.categoryName() to it.score().toDouble() }, numTokens = 0, numTruncated = 0,
            latency = Latency(0.0, elapsedMs, 0.0, threads))
    }

    override fun close() = classifier.close()

    companion object {
        const val MODEL = "model_mediapipe.tflite"
    }
}
