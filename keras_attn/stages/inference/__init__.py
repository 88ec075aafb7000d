"""Running exported models: `load_predictor` (every artifact kind, texts in, labels or
entities out) and a TF Serving-compatible REST server for the SavedModel."""

from keras_attn.stages.inference.http_server import make_server
from keras_attn.stages.inference.predictor import Predictor
from keras_attn.stages.inference.predictor import PredictorError
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.stages.inference.rest_api import RestApi

__all__ = ["Predictor", "PredictorError", "RestApi", "load_predictor", "make_server"]
