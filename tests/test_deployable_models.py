"""`deployable_models`: the classifiers and taggers that export and serving take."""

import pytest

from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.models import BertTokenClassifier
from keras_attn.models import XLNetBackbone
from keras_attn.models import XLNetClassifier
from keras_attn.models import XLNetTokenClassifier
from keras_attn.models.deployable_models import TAGGERS
from keras_attn.models.deployable_models import check_deployable_model
from keras_attn.runs.run_directory import output_count


def test_bert_and_xlnet_classifiers_and_taggers_are_taken_with_their_label_counts():
    bert = BertBackbone(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
                        intermediate_dim=16, max_sequence_length=8)
    xlnet = XLNetBackbone(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
                          intermediate_dim=16)
    models = [BertClassifier(bert, num_classes=2), BertTokenClassifier(bert, num_labels=3),
              XLNetClassifier(xlnet, num_classes=4), XLNetTokenClassifier(xlnet, num_classes=5)]
    for model in models:
        check_deployable_model(model, "")
    assert [output_count(model) for model in models] == [2, 3, 4, 5]
    assert [isinstance(model, TAGGERS) for model in models] == [False, True, False, True]
    with pytest.raises(ValueError, match=r"a classifier or a tagger \(BertClassifier, "
                       r"XLNetClassifier, BertTokenClassifier, XLNetTokenClassifier\) to "
                       "serve it. Received: model=BertBackbone"):
        check_deployable_model(bert, " to serve it")
