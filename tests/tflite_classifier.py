"""A tiny random-weight classifier converted to `model_fp32.tflite`, with its vocabulary,
labels, tokenizer and model card: the fixture of the TFLite metadata and MediaPipe tests
(one conversion, about 10 s)."""

import keras

from keras_attn.export.tflite.tflite_export import export_tflite
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.runs.export_directory import ModelCard
from keras_attn.text.tokenizer import WordPieceTokenizer

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "good",
              "bad", "very", "plot", "cafe", "ete", "a", "##s", ".", "!"]
LABELS = ["negative", "neutral", "positive"]
LENGTH = 16


def tiny_classifier(directory):
    """`(model, path of model_fp32.tflite, tokenizer, card)` in `directory`."""
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2,
                            hidden_dim=16, intermediate_dim=32, max_sequence_length=LENGTH)
    model = BertClassifier(backbone, num_classes=len(LABELS))
    logits = model.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)  # probabilities away from uniform
    results = export_tflite(model, str(directory), variants=["fp32"], sequence_length=LENGTH)
    tokenizer = WordPieceTokenizer(list(VOCABULARY), lowercase=True, sequence_length=LENGTH)
    card = ModelCard.card_dict("classification", LABELS, LENGTH, tokenizer, lowercase=True)
    return model, results["fp32"]["path"], tokenizer, card
