package dev.kerasattn.core

/**
 * The fields of an exported `model_card.json` the app needs (written by
 * `keras_attn.runs.ModelCard.card_dict`).
 *
 * Example:
 * ```
 * val card = ModelCard.parse(File("model_card.json").readText(), "model_card.json")
 * card.task            // "classification" or "ner"
 * card.sequenceLength  // the fixed input length of the .tflite models
 * ```
 */
class ModelCard(
    val task: String,
    val labels: List<String>,
    val sequenceLength: Int,
    val vocabularySize: Int,
    val lowercase: Boolean,
    val stripAccents: Boolean,
    val clsTokenId: Int,
    val sepTokenId: Int,
    val padTokenId: Int,
    val unknownTokenId: Int,
    val maxWordCharacters: Int,
    val inputNames: List<String>,
    val crf: CrfTransitions?
) {
    val isTagger: Boolean get() = task == "ner"

    companion object {
        const val FORMAT = "keras-attn model card 1"

        /**
         * Reads and checks a card.
         *
         * @param text the JSON document.
         * @param source file name for messages.
         * @throws AssetException (or [JsonException]) saying which field is wrong and how.
         */
        @JvmStatic
        fun parse(text: String, source: String = "model_card.json"): ModelCard {
            val root = Json.parse(text, source) as? Map<*, *> ?: throw AssetException("$source: the card must be a JSON object")
            val format = Json.stringField(root, "format", source)
            if (format != FORMAT) throw AssetException("$source: format \"$format\" is not \"$FORMAT\": export the model with this keras-attn version")
            val task = Json.stringField(root, "task", source)
            if (task != "classification" && task != "ner") {
                throw AssetException("$source: task \"$task\" has no on-device pipeline (classification or ner)")
            }
            val labels = Json.listField(root, "labels", source).mapIndexed { i, label ->
                label as? String ?: throw AssetException("$source: labels[$i] must be a string")
            }
            if (labels.isEmpty()) throw AssetException("$source: \"labels\" is empty")
            if (task == "ner") {
                for (label in labels) {
                    if (!Ner.isIobTag(label)) throw AssetException("$source: label \"$label\" is not an IOB2 tag (O, B-TYPE, I-TYPE)")
                }
                if ("O" !in labels) throw AssetException("$source: a tagger's labels need the \"O\" tag")
            }
            val length = Json.intField(root, "sequence_length", source)
            if (length < 3) throw AssetException("$source: sequence_length must be >= 3, got $length")
            val tokenizer = Json.objectField(root, "tokenizer", "$source: tokenizer")
            val where = "$source: tokenizer"
            val lowercase = Json.booleanField(tokenizer, "lowercase", where)
            val stripAccents = Json.booleanField(tokenizer, "strip_accents", where)
            if (lowercase != stripAccents) {
                throw AssetException("$where: lowercase=$lowercase with strip_accents=$stripAccents is not supported " +
                    "on the device (the reference normalizer does both or neither)")
            }
            val vocabularySize = Json.intField(tokenizer, "vocabulary_size", where)
            val ids = listOf("cls_token_id", "sep_token_id", "pad_token_id", "unknown_token_id").map {
                val id = Json.intField(tokenizer, it, where)
                if (id < 0 || id >= vocabularySize) throw AssetException("$where: $it=$id is outside the vocabulary (size $vocabularySize)")
                id
            }
            // Cards written before the tokenizer followed HF hold "max_word_bytes" (100, read
            // as the character limit).
            val maxWordCharacters = if (tokenizer.containsKey("max_word_bytes")) Json.intField(tokenizer, "max_word_bytes", where)
                else Json.intField(tokenizer, "max_word_characters", where)
            val inputs = Json.listField(root, "inputs", source).mapIndexed { i, input ->
                val entry = input as? Map<*, *> ?: throw AssetException("$source: inputs[$i] must be an object")
                val shape = Json.toIntArray(Json.listField(entry, "shape", "$source: inputs[$i]"), "$source: inputs[$i].shape")
                if (shape.toList() != listOf(1, length)) {
                    throw AssetException("$source: inputs[$i].shape ${shape.toList()} is not [1, $length]")
                }
                Json.stringField(entry, "name", "$source: inputs[$i]")
            }
            var crf: CrfTransitions? = null
            val crfEntry = root["crf"]
            if (crfEntry != null) {
                if (task != "ner") throw AssetException("$source: only a tagger can have \"crf\" transitions")
                val section = crfEntry as? Map<*, *> ?: throw AssetException("$source: \"crf\" must be an object or null")
                val w = "$source: crf"
                val rows = Json.listField(section, "transitions", w)
                crf = try {
                    CrfTransitions(
                        Array(rows.size) { Json.toDoubleArray(rows[it], "$w.transitions[$it]") },
                        Json.toDoubleArray(Json.listField(section, "start_transitions", w), "$w.start_transitions"),
                        Json.toDoubleArray(Json.listField(section, "end_transitions", w), "$w.end_transitions"))
                } catch (e: IllegalArgumentException) {
                    if (e is JsonException) throw e
                    throw AssetException("$w: ${e.message}")
                }
                if (crf.numTags != labels.size) throw AssetException("$w: ${crf.numTags} tags, but ${labels.size} labels")
            }
            return ModelCard(task, labels, length, vocabularySize, lowercase, stripAccents,
                ids[0], ids[1], ids[2], ids[3], maxWordCharacters, inputs, crf)
        }
    }

    /**
     * A tokenizer over `vocabulary` (`vocab.txt` lines), checked against the card: its size
     * and special ids must be the card's.
     */
    fun tokenizer(vocabulary: List<String>, tables: TextTables, source: String = "vocab.txt"): WordPieceTokenizer {
        if (vocabulary.size != vocabularySize) {
            throw AssetException("$source has ${vocabulary.size} tokens but the model card says vocabulary_size=$vocabularySize: " +
                "copy vocab.txt from the same export directory as the model")
        }
        val tokenizer = WordPieceTokenizer(vocabulary, lowercase, tables, maxWordCharacters,
            unknownToken = vocabulary[unknownTokenId], clsToken = vocabulary[clsTokenId],
            sepToken = vocabulary[sepTokenId], padToken = vocabulary[padTokenId])
        return tokenizer
    }

    /** Checks `labels.txt` lines against the card's labels. */
    fun checkLabels(lines: List<String>, source: String = "labels.txt") {
        val labelsFromFile = lines.filter { it.isNotEmpty() }
        if (labelsFromFile != labels) {
            throw AssetException("$source (${labelsFromFile.size} labels) differs from the model card's labels " +
                "(${labels.size}: ${labels.take(6)}...): copy both from the same export directory")
        }
    }

    /**
     * Checks the model's tensor shapes against the card: every input `[1, sequenceLength]`
     * and the output `[1, labels]` (classifier) or `[1, sequenceLength, labels]` (tagger).
     *
     * @param inputShapes name -> shape of the model's inputs.
     * @param outputShape shape of its (first) output.
     * @param source the model file name for the message.
     */
    fun checkModelShapes(inputShapes: Map<String, IntArray>, outputShape: IntArray, source: String) {
        for (name in inputNames) {
            val shape = inputShapes[name]
                ?: throw AssetException("$source has no input \"$name\" (inputs: ${inputShapes.keys}); the card expects $inputNames")
            if (shape.toList() != listOf(1, sequenceLength)) {
                throw AssetException("$source input \"$name\" has shape ${shape.toList()}, the model card says [1, $sequenceLength]: " +
                    "model and card come from different exports (or --sequence-length differs)")
            }
        }
        val expected = if (isTagger) listOf(1, sequenceLength, labels.size) else listOf(1, labels.size)
        if (outputShape.toList() != expected) {
            throw AssetException("$source output has shape ${outputShape.toList()}, expected $expected " +
                "(${labels.size} labels in the card): model and card come from different exports")
        }
    }
}
