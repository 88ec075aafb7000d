"""The task models of the deployable tasks (`keras-attn export`, serving, the text-in files):
classifiers, one label per text, and taggers, one label per word piece; BERT's and XLNet's
(the same three id inputs, `[CLS] text [SEP]`)."""

from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.xlnet_classifier import XLNetClassifier
from keras_attn.models.xlnet_token_classifier import XLNetTokenClassifier

CLASSIFIERS = (BertClassifier, XLNetClassifier)
TAGGERS = (BertTokenClassifier, XLNetTokenClassifier)


def check_deployable_model(model, context):
    """Raises unless `model` is a classifier or a tagger of `CLASSIFIERS` / `TAGGERS`;
    `context` ends the message (what needs it)."""
    if not isinstance(model, CLASSIFIERS + TAGGERS):
        names = ", ".join(kind.__name__ for kind in CLASSIFIERS + TAGGERS)
        raise ValueError(f"`model` must be a classifier or a tagger ({names}){context}. "
                         f"Received: model={type(model).__name__}")
