"""`TextTFLitePredictor`: `model_text.tflite`, text in, the tokenizer inside the graph
(tf-text custom ops), one text per call."""

from keras_attn.export.artifacts import decode_text_entities
from keras_attn.stages.inference.predictor_base import Predictor
from keras_attn.stages.inference.predictor_base import PredictorError
from keras_attn.stages.inference.predictor_base import classification_result
from keras_attn.stages.inference.predictor_base import ner_result


class TextTFLitePredictor(Predictor):
    """`model_text.tflite`: text in, tokenizer inside (tf-text custom ops), one text per call.

    Args:
        artifact: the file's `LoadedArtifact` (`keras_attn.export.artifacts.load_artifact`).
        model_card: the export's `ModelCard` (task, labels, the CRF of a CRF tagger).
    """

    def __init__(self, artifact, model_card):
        card, labels = model_card.card, model_card.label_vocabulary()
        path = artifact.path
        super().__init__(path, "text_tflite", card["task"], labels)
        self.run_text = artifact.run_text
        self.crf = model_card.crf()
        outputs = artifact.output_shapes
        kind = "ner" if "word_ids" in outputs else "classification"
        if kind != card["task"]:
            raise PredictorError(
                f"{path} is a {kind} model but its model_card.json says task "
                f"{card['task']!r}: the files come from different exports")
        if outputs["logits"][-1] != len(labels):
            raise PredictorError(
                f"{path} outputs {outputs['logits'][-1]} scores but model_card.json "
                f"lists {len(labels)} labels: the files come from different exports")

    def _predict(self, texts):
        results = []
        for text in texts:
            out = self.run_text(text)
            if self.task == "classification":
                results.append(classification_result(self.labels, out["probabilities"][0]))
                continue
            decoded = decode_text_entities(out, text, self.labels, crf=self.crf)
            starts, ends = out["word_start"].reshape(-1), out["word_end"].reshape(-1)
            words = [(text[starts[i]:ends[i]], starts[i], ends[i], tag)
                     for i, tag in enumerate(decoded["tags"])
                     if i < len(starts) and starts[i] >= 0]
            results.append(ner_result(decoded["entities"], words,
                                      decoded["num_truncated_words"]))
        return results
