"""Text pipeline: tokenizer, dataset readers, batching, NER and pretraining data.

TensorFlow-specific by design (tensorflow-text and tf.data), so that the same tokenizer runs
in training, inside the exported SavedModel and in TFLite.
"""

from keras_attn.text.batching import SequenceBatcher
from keras_attn.text.batching import TruncationCounter
from keras_attn.text.batching import model_inputs_at_length
from keras_attn.text.classification_reader import ClassificationExample
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.conll_reader import TaggedSentence
from keras_attn.text.conll_reader import iob1_to_iob2
from keras_attn.text.entity_prediction import ner_model_inputs
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.errors import DataError
from keras_attn.text.hard_cases import HARD_CASES
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.ner import IGNORE_LABEL
from keras_attn.text.ner import Entity
from keras_attn.text.ner import align_word_labels
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.ner import entity_scores
from keras_attn.text.ner import entity_spans
from keras_attn.text.ner import iob2_entities
from keras_attn.text.ner import repair_iob2
from keras_attn.text.ner import word_offsets_from_subwords
from keras_attn.text.parallel_corpus import read_parallel_files
from keras_attn.text.pretraining_data import MaskedLMMasker
from keras_attn.text.pretraining_data import NextSentencePairs
from keras_attn.text.raw_text_reader import Document
from keras_attn.text.raw_text_reader import RawTextReader
from keras_attn.text.text_lines import ReadReport
from keras_attn.text.text_lines import read_lines
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.vocabulary import check_vocabulary
from keras_attn.text.vocabulary import load_vocabulary
from keras_attn.text.vocabulary import save_vocabulary
from keras_attn.text.vocabulary import train_wordpiece_vocabulary
from keras_attn.text.word_splitter import character_class
from keras_attn.text.word_splitter import split_words
from keras_attn.text.word_splitter import split_words_tf

__all__ = [
    "HARD_CASES",
    "IGNORE_LABEL",
    "ClassificationExample",
    "ClassificationReader",
    "ConllReader",
    "DataError",
    "Document",
    "Entity",
    "JoinedWordPieces",
    "LabelVocabulary",
    "MaskedLMMasker",
    "NextSentencePairs",
    "RawTextReader",
    "ReadReport",
    "SequenceBatcher",
    "TaggedSentence",
    "TruncationCounter",
    "WordPieceTokenizer",
    "align_word_labels",
    "character_class",
    "check_vocabulary",
    "decode_word_labels",
    "entity_scores",
    "entity_spans",
    "iob1_to_iob2",
    "iob2_entities",
    "load_vocabulary",
    "model_inputs_at_length",
    "ner_model_inputs",
    "predict_entities",
    "read_lines",
    "read_parallel_files",
    "repair_iob2",
    "save_vocabulary",
    "split_words",
    "split_words_tf",
    "train_wordpiece_vocabulary",
    "word_offsets_from_subwords",
]
