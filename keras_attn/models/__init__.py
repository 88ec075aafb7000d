"""keras-attn models: functional backbones and the task models built on them."""

from keras_attn.models.attention_rnn_seq2seq import ATTENTION_RNN_PRESETS
from keras_attn.models.attention_rnn_seq2seq import AttentionRNNSeq2Seq
from keras_attn.models.auxiliary_loss_lm import AuxiliaryLossLM
from keras_attn.models.backbone import Backbone
from keras_attn.models.bert_backbone import BERT_PRESETS
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_backbone import bert_parameter_count
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_masked_lm import BertMaskedLM
from keras_attn.models.bert_pretrainer import BertPretrainer
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.gpt_backbone import GPT_PRESETS
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_backbone import gpt_parameter_count
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.models.masked_lm_head import MaskedLMHead
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.models.permutation_lm_inputs import permutation_lm_inputs
from keras_attn.models.seq2seq_transformer import SEQ2SEQ_TRANSFORMER_PRESETS
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
from keras_attn.models.seq2seq_transformer import make_teacher_forcing_batch
from keras_attn.models.task_model import TaskModel
from keras_attn.models.transformer_xl_lm import TRANSFORMER_XL_PRESETS
from keras_attn.models.transformer_xl_lm import TransformerXLLM
from keras_attn.models.xlnet_backbone import XLNET_PRESETS
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_backbone import xlnet_parameter_count
from keras_attn.models.xlnet_classifier import XLNetClassifier
from keras_attn.models.xlnet_lm import XLNetLM
from keras_attn.models.xlnet_token_classifier import XLNetTokenClassifier

__all__ = [
    "ATTENTION_RNN_PRESETS",
    "BERT_PRESETS",
    "GPT_PRESETS",
    "SEQ2SEQ_TRANSFORMER_PRESETS",
    "TRANSFORMER_XL_PRESETS",
    "AttentionRNNSeq2Seq",
    "AuxiliaryLossLM",
    "Backbone",
    "BertBackbone",
    "BertClassifier",
    "BertMaskedLM",
    "BertPretrainer",
    "BertTokenClassifier",
    "GPTBackbone",
    "GPTCausalLM",
    "MaskedLMHead",
    "MaskedSparseCategoricalCrossentropy",
    "Seq2SeqTransformer",
    "TaskModel",
    "TransformerXLLM",
    "bert_parameter_count",
    "gpt_parameter_count",
    "make_teacher_forcing_batch",
    "XLNET_PRESETS",
    "XLNetBackbone",
    "XLNetClassifier",
    "XLNetLM",
    "XLNetTokenClassifier",
    "permutation_lm_inputs",
    "xlnet_parameter_count",
]
