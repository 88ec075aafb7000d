package dev.kerasattn.demo

import android.graphics.Color
import android.os.Bundle
import android.os.Handler
import android.os.Looper
import android.text.SpannableStringBuilder
import android.text.Spanned
import android.text.style.BackgroundColorSpan
import android.view.View
import android.widget.Button
import android.widget.CheckBox
import android.widget.EditText
import android.widget.SeekBar
import android.widget.TextView
import androidx.appcompat.app.AppCompatActivity
import com.google.android.material.tabs.TabLayout
import dev.kerasattn.core.CodePoints
import java.util.Locale
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors

/**
 * Two tabs over the exported models in the assets: Classify (label, probabilities, latency)
 * and Entities (the text with entity spans coloured by type, latency). Models load and run on
 * one background thread; the UI thread only shows results and errors.
 */
class MainActivity : AppCompatActivity() {
    private lateinit var tabs: TabLayout
    private lateinit var input: EditText
    private lateinit var threadsLabel: TextView
    private lateinit var threadsBar: SeekBar
    private lateinit var runButton: Button
    private lateinit var mediaPipe: CheckBox
    private lateinit var result: TextView
    private lateinit var details: TextView
    private lateinit var latency: TextView
    private lateinit var error: TextView

    // One inference thread: interpreters are not thread-safe and requests queue in order.
    private val worker: ExecutorService = Executors.newSingleThreadExecutor()
    private val main = Handler(Looper.getMainLooper())
    private val slots = HashMap<String, ModelSlot>()  // touched on the worker thread only
    private var mediaPipeSlot: MediaPipeSlot? = null  // the worker thread only
    private val texts = mutableMapOf<String, String>()
    private var folder = CLASSIFY

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        tabs = findViewById(R.id.tabs)
        input = findViewById(R.id.input)
        threadsLabel = findViewById(R.id.threads_label)
        threadsBar = findViewById(R.id.threads)
        runButton = findViewById(R.id.run)
        mediaPipe = findViewById(R.id.mediapipe)
        result = findViewById(R.id.result)
        details = findViewById(R.id.details)
        latency = findViewById(R.id.latency)
        error = findViewById(R.id.error)

        texts[CLASSIFY] = getString(R.string.default_classify_text)
        texts[ENTITIES] = getString(R.string.default_entities_text)
        tabs.addTab(tabs.newTab().setText(R.string.tab_classify))
        tabs.addTab(tabs.newTab().setText(R.string.tab_entities))
        tabs.addOnTabSelectedListener(object : TabLayout.OnTabSelectedListener {
            override fun onTabSelected(tab: TabLayout.Tab) {
                texts[folder] = input.text.toString()
                folder = if (tab.position == 0) CLASSIFY else ENTITIES
                showTab()
            }

            override fun onTabUnselected(tab: TabLayout.Tab) = Unit
            override fun onTabReselected(tab: TabLayout.Tab) = Unit
        })

        threadsBar.progress = DEFAULT_THREADS - 1
        threadsLabel.text = getString(R.string.threads, DEFAULT_THREADS)
        threadsBar.setOnSeekBarChangeListener(object : SeekBar.OnSeekBarChangeListener {
            override fun onProgressChanged(bar: SeekBar, progress: Int, fromUser: Boolean) {
                threadsLabel.text = getString(R.string.threads, progress + 1)
            }

            override fun onStartTrackingTouch(bar: SeekBar) = Unit
            override fun onStopTrackingTouch(bar: SeekBar) = Unit
        })
        runButton.setOnClickListener { runCurrent() }
        showTab()
    }

    override fun onDestroy() {
        worker.execute {
            for (slot in slots.values) slot.close()
            slots.clear()
            mediaPipeSlot?.close()
            mediaPipeSlot = null
        }
        worker.shutdown()
        super.onDestroy()
    }

    private fun showTab() {
        input.setText(texts[folder])
        mediaPipe.visibility = if (folder == CLASSIFY) View.VISIBLE else View.GONE
        result.text = ""
        details.text = ""
        latency.text = ""
        error.text = ""
        // Load the tab's model early, so that missing or mismatched assets show at once.
        val threads = threadsBar.progress + 1
        val current = folder
        worker.execute {
            try {
                val slot = slot(current, threads)
                main.post { if (folder == current) details.text = describe(slot) }
            } catch (e: Exception) {
                main.post { if (folder == current) showError(e) }
            }
        }
    }

    private fun runCurrent() {
        val text = input.text.toString()
        val threads = threadsBar.progress + 1
        val current = folder
        val useMediaPipe = current == CLASSIFY && mediaPipe.isChecked
        error.text = ""
        runButton.isEnabled = false
        worker.execute {
            try {
                if (useMediaPipe) {
                    val engine = mediaPipeSlot ?: MediaPipeSlot(applicationContext, threads).also { mediaPipeSlot = it }
                    val answer = engine.classify(text)
                    main.post { showMediaPipe(answer) }
                    return@execute
                }
                val slot = slot(current, threads)
                if (current == CLASSIFY) {
                    val answer = slot.classify(text)
                    main.post { showClassification(answer, slot) }
                } else {
                    val answer = slot.tag(text)
                    main.post { showEntities(text, answer, slot) }
                }
            } catch (e: Exception) {
                main.post { showError(e) }
            } finally {
                main.post { runButton.isEnabled = true }
            }
        }
    }

    /** The loaded model of `current`, created again when the thread count changed. */
    private fun slot(current: String, threads: Int): ModelSlot {
        val loaded = slots[current]
        if (loaded != null && loaded.threads == threads) return loaded
        loaded?.close()
        slots.remove(current)
        val slot = ModelSlot(assets, current, threads)
        slots[current] = slot
        return slot
    }

    private fun showClassification(answer: Classification, slot: ModelSlot) {
        if (folder != CLASSIFY) return
        result.text = answer.label
        details.text = buildString {
            append(probabilityBars(answer))
            append(String.format(Locale.ROOT, "%d tokens of %d", answer.numTokens, slot.card.sequenceLength))
            if (answer.numTruncated > 0) append(String.format(Locale.ROOT, ", %d pieces cut", answer.numTruncated))
        }
        latency.text = describe(answer.latency, slot)
    }

    /** MediaPipe's answer: its labels and scores (probabilities: the file ends in a softmax). */
    private fun showMediaPipe(answer: Classification) {
        if (folder != CLASSIFY) return
        result.text = answer.label
        details.text = probabilityBars(answer)
        latency.text = String.format(Locale.ROOT, "%.1f ms (tokenize + model + decode) · MediaPipe TextClassifier",
            answer.latency.totalMs)
    }

    /** One line per label: name, percentage and a bar of up to 20 blocks. */
    private fun probabilityBars(answer: Classification) = buildString {
        for ((label, probability) in answer.probabilities) {
            append(String.format(Locale.ROOT, "%-12s %6.2f %%  %s%n", label, 100 * probability,
                "█".repeat((probability * 20).toInt())))
        }
    }

    private fun showEntities(text: String, answer: Tagging, slot: ModelSlot) {
        if (folder != ENTITIES) return
        val palette = resources.getStringArray(R.array.entity_colors).map { Color.parseColor(it) }
        val types = slot.card.labels.filter { it != "O" }.map { it.substring(2) }.distinct()
        val highlighted = SpannableStringBuilder(text)
        for (span in answer.entities.spans) {
            // Offsets are code points; Android spans index UTF-16 units.
            val start = CodePoints.toUtf16Index(text, span.startChar)
            val end = CodePoints.toUtf16Index(text, span.endChar)
            val color = palette[types.indexOf(span.type).coerceAtLeast(0) % palette.size]
            highlighted.setSpan(BackgroundColorSpan(color), start, end, Spanned.SPAN_EXCLUSIVE_EXCLUSIVE)
        }
        result.text = highlighted
        val legend = SpannableStringBuilder()
        for ((index, type) in types.withIndex()) {
            val start = legend.length
            legend.append(" ").append(type).append(" ")
            legend.setSpan(BackgroundColorSpan(palette[index % palette.size]), start, legend.length,
                Spanned.SPAN_EXCLUSIVE_EXCLUSIVE)
            legend.append("  ")
        }
        legend.append("\n")
        for (span in answer.entities.spans) legend.append("${span.type}: ${span.text} [${span.startChar}, ${span.endChar})\n")
        legend.append("${answer.entities.words.size} words")
        if (answer.numTruncatedWords > 0) legend.append(", ${answer.numTruncatedWords} beyond the sequence length (tagged O)")
        details.text = legend
        latency.text = describe(answer.latency, slot)
    }

    private fun describe(latency: Latency, slot: ModelSlot) = String.format(Locale.ROOT,
        "%.1f ms = tokenize %.2f + model %.1f + decode %.2f ms · %d thread%s · %s",
        latency.totalMs, latency.tokenizeMs, latency.modelMs, latency.decodeMs, latency.threads,
        if (latency.threads > 1) "s" else "", slot.variant)

    private fun describe(slot: ModelSlot) = String.format(Locale.ROOT,
        "%s model (%s): %d labels, sequence length %d%s", slot.card.task, slot.variant, slot.card.labels.size,
        slot.card.sequenceLength, if (slot.card.crf != null) ", CRF decoding" else "")

    private fun showError(e: Exception) {
        error.text = e.message ?: e.javaClass.simpleName
        error.visibility = View.VISIBLE
    }

    private companion object {
        const val CLASSIFY = "classify"
        const val ENTITIES = "entities"
        const val DEFAULT_THREADS = 2
    }
}
