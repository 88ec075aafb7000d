"""Checkpoint importers: pretrained weights from other libraries into keras-attn models.

Every importer checks the whole checkpoint before assigning anything: unknown, missing and
wrongly shaped tensors are listed together in one error; nothing is silently skipped.
"""

from keras_attn.checkpoints.google_bert import load_google_bert
from keras_attn.checkpoints.hf_bert import load_hf_bert
from keras_attn.checkpoints.hf_gpt2 import load_hf_gpt2
from keras_attn.checkpoints.hf_xlnet import load_hf_xlnet

__all__ = ["load_google_bert", "load_hf_bert", "load_hf_gpt2", "load_hf_xlnet"]
