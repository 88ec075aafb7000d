"""Tiny trained and exported runs for the tests of what consumes exports (predictor, server).

`classification_run(root)` / `ner_run(root)` train a toy run (1 layer, hidden 16, sequence
16; the data of `tests/test_trainer.py` and `tests/test_run_exporter.py`) with
`keras-attn train`'s `Trainer` and export it with `export_run` at the cheapest settings
(calibration-only QAT, one latency run, no golden data sentences). Each returns
`(run_dir, export_dir)`, copies under `root` of one run made once per test session and shared
by the pytest-xdist workers (`tests/session_cache.py`): the training and export took 60-300 s
per call on 2 busy cores, and several test modules read the same run.
"""

import pathlib

from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.run_exporter import export_run
from keras_attn.stages.train_stage import Trainer
from tests.session_cache import cached_directory
from tests.session_cache import copy_into
from tests.test_run_exporter import FILLER
from tests.test_run_exporter import TAGS
from tests.test_run_exporter import write_conll
from tests.test_trainer import config_dict
from tests.test_trainer import write_data

QUICK_EXPORT = dict(quantization=QuantizationRecipe.all_int8(calibration_examples=8),
                    latency_runs=1, latency_threads=(1,), golden_examples=0,
                    max_eval_examples=8)


def _train_and_export(root, values):
    Trainer(TrainingConfig.from_dict(values)).run()
    export_run(root / "run", root / "export", ExportOptions(**QUICK_EXPORT))


def _shared(key, build, root):
    """`(run_dir, export_dir)` under `root`: a copy of the session's run made by `build`."""
    root = copy_into(cached_directory(key, build), root)
    return root / "run", root / "export"


def _classification(root):
    data = write_data(root / "data")
    _train_and_export(root, config_dict(data, root / "run", epochs=10, learning_rate=1e-2))


def classification_run(root):
    """A sentiment run (labels "0"/"1": whether a positive word occurs) and its export."""
    return _shared("classification_run", _classification, root)


def ner_run(root, use_crf=False):
    """A tagger (softmax, or CRF with `use_crf`) of LOC and PER entities ("paris",
    "new york", "marco smith") and its export."""
    return _shared(f"ner_run_crf_{use_crf}",
                   lambda directory: _train_and_export(directory, ner_config(directory, use_crf)),
                   root)


def ner_config(root, use_crf=False):
    """The training config (a dict) of `ner_run`, its data and vocabulary written to `root`;
    the run goes to `root/run`."""
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *TAGS, "##s"]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    values = config_dict(root, root / "run", epochs=10, learning_rate=1e-2)
    values.update(task="ner")
    values["data"] = {"train": write_conll(root / "train.txt", 96, 0),
                      "dev": write_conll(root / "dev.txt", 24, 1), "max_length": 16}
    values["model"]["vocabulary"] = str(root / "vocab.txt")
    values["model"]["use_crf"] = use_crf
    return values
