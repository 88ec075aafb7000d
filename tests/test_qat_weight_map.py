"""`QatBert`'s weight map is derived from the backbone's canonical one
(`bert_weight_targets`): every QAT weight is paired once, with the float variable of the
same canonical names."""

import pytest

from keras_attn.checkpoints.bert_weights import bert_weight_targets
from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.models import BertTokenClassifier
from keras_attn.quantization import QatBert
from keras_attn.quantization.qat_bert import _weight_pairs

pytestmark = pytest.mark.tensorflow  # QatBert is the TFLite export path, as in test_qat_bert


def backbone(fused_qkv=True):
    return BertBackbone(vocabulary_size=20, num_layers=2, num_heads=2, hidden_dim=4,
                        intermediate_dim=8, max_sequence_length=8, fused_qkv=fused_qkv)


@pytest.mark.parametrize("make_model", [
    lambda: BertClassifier(backbone(), num_classes=3),
    lambda: BertTokenClassifier(backbone(fused_qkv=False), num_labels=3),
])
def test_every_weight_is_paired_once_by_canonical_name(make_model):
    model = make_model()
    qat = QatBert.from_float(model)
    pairs = _weight_pairs(qat, model)
    assert sorted(v.path for v, _ in pairs) == sorted(v.path for v in qat.weights
                                                      if v.trainable)
    names_of = {id(v): names for v, names, _ in bert_weight_targets(model.backbone)[0]}
    block = qat.get_layer("transformer_layer_1")
    (source,) = [s for q, s in pairs if q is block.qkv_kernel]
    sources = source if isinstance(source, list) else [source]
    names = [n for s in sources for n in names_of[id(s)]]
    assert names == [f"encoder/layer_1/attention/self/{p}/kernel"
                     for p in ("query", "key", "value")]
