"""`IdsPredictor`: a TFLite or ONNX file on token ids, tokenized and decoded in Python with
its model card (`WordPieceTokenizer`, labels, the CRF's Viterbi for a CRF tagger)."""

import numpy as np

from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.runs.task_head import crf_tags
from keras_attn.stages.inference.predictor_base import Predictor
from keras_attn.stages.inference.predictor_base import classification_result
from keras_attn.stages.inference.predictor_base import python_ner_results
from keras_attn.stages.inference.predictor_base import softmax


class _ArtifactModel:
    """Looks like a `BertTokenClassifier` to `predict_entities`: `use_crf`, and a call on the
    id inputs returning logits, or `{"logits", "tags"}` decoded with the card's CRF."""

    def __init__(self, run_logits, crf):
        self.run_logits = run_logits
        self.crf = crf
        self.use_crf = crf is not None

    def __call__(self, inputs, training=False):
        logits = self.run_logits({name: inputs[name] for name in ID_INPUTS})
        if self.crf is None:
            return logits
        # `label_mask` is `first_piece_mask(word_ids)` (`ner_model_inputs`).
        tags = crf_tags(logits, self.crf, np.asarray(inputs["label_mask"]).astype(bool))
        return {"logits": logits, "tags": tags}


class IdsPredictor(Predictor):
    """A TFLite or ONNX artifact on token ids, tokenized and decoded in Python.

    Args:
        path: the artifact.
        kind: `"tflite"` or `"onnx"`.
        run_logits: callable, dict of `(B, L)` int32 arrays -> `(B, C)` or `(B, L, C)` logits.
        model_card: the export's `ModelCard` (task, labels, tokenizer settings, CRF).
    """

    def __init__(self, path, kind, run_logits, model_card):
        super().__init__(path, kind, model_card.task, model_card.label_vocabulary())
        self.run_logits = run_logits
        self.tokenizer = model_card.tokenizer()
        self.model = _ArtifactModel(run_logits, model_card.crf())

    def _predict(self, texts):
        if self.task == "ner":
            return python_ner_results(self.model, self.tokenizer, self.labels, texts)
        if not texts:
            return []
        packed = self.tokenizer(texts)
        x = {name: np.asarray(packed[name]).astype("int32") for name in ID_INPUTS}
        return [classification_result(self.labels, p) for p in softmax(self.run_logits(x))]
