"""TrainingConfig: every error path, the defaults, overrides and the `to_dict` round trip.

The checks are pure Python (YAML + a schema) and need no backend, so these tests run in the
JAX stage too (TensorFlow is installed there; only the TF backend is not selected).
"""

import dataclasses
import pathlib
import re
import typing

import pytest

from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.config_schema import config_keys
from keras_attn.runs.config_schema import parse_override
from keras_attn.runs.training_config import DataSection
from keras_attn.runs.training_config import DistributeSection
from keras_attn.runs.training_config import ModelSection
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.runs.training_config import TrainSection

MINIMAL = {"task": "classification", "data": {"train": "train.tsv"},
           "model": {"preset": "bert_tiny"}}


def minimal(**sections):
    """MINIMAL with some sections replaced or extended (a fresh dict each time)."""
    values = {"task": MINIMAL["task"], "data": dict(MINIMAL["data"]),
              "model": dict(MINIMAL["model"])}
    for name, section in sections.items():
        if isinstance(section, dict) and isinstance(values.get(name), dict):
            values[name].update(section)
        else:
            values[name] = section
    return values


def write_config(directory, text, name="config.yaml"):
    path = pathlib.Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and round trip ------------------------------------------------------------


def test_defaults_of_a_minimal_config():
    config = TrainingConfig.from_dict(MINIMAL)
    assert config.task == "classification" and config.output_dir is None
    assert config.source is None
    data, model, train = config.data, config.model, config.train
    assert (data.train, data.dev, data.test) == ("train.tsv", None, None)
    assert (data.text_column, data.label_column, data.header) == (0, -1, "infer")
    assert (data.max_length, data.target_max_length, data.mask_rate) == (128, 64, 0.15)
    assert data.max_train_examples is None and data.next_sentence_prediction is False
    assert (model.preset, model.checkpoint, model.vocabulary) == ("bert_tiny", None, None)
    assert (model.vocabulary_size, model.lowercase, model.dropout) == (8000, True, 0.1)
    assert model.use_crf is False and model.overrides == {}
    assert (train.epochs, train.max_steps, train.global_batch_size) == (3, None, 32)
    assert train.per_replica_batch_size is None and train.gradient_accumulation_steps == 1
    assert (train.learning_rate, train.warmup_ratio, train.warmup_steps) == (5e-5, 0.1, None)
    assert (train.decay, train.end_learning_rate_ratio, train.weight_decay) == (
        "linear", 0.0, 0.01)
    assert (train.beta_1, train.beta_2, train.epsilon, train.clipnorm) == (
        0.9, 0.999, 1e-6, 1.0)
    assert (train.seed, train.deterministic, train.mixed_precision) == (0, False, None)
    assert (train.jit_compile, train.runner, train.bucket_by_length) == (False, "auto", True)
    assert (train.eval_batch_size, train.early_stopping_patience) == (64, None)
    assert (train.checkpoint_every_steps, train.keep_checkpoints, train.log_every_steps) == (
        500, 3, 50)
    assert config.distribute.to_dict() == {"strategy": "auto", "tpu": None,
                                           "logical_cpu_devices": None}


def test_mutable_defaults_are_not_shared_between_configs():
    first = TrainingConfig.from_dict(MINIMAL)
    first.model.overrides["num_layers"] = 1
    assert TrainingConfig.from_dict(MINIMAL).model.overrides == {}


def test_to_dict_round_trip(tmp_path):
    values = minimal(output_dir="runs/x", train={"epochs": 7, "learning_rate": 1,
                                                 "decay": "cosine"},
                     distribute={"strategy": "mirrored", "logical_cpu_devices": 2},
                     model={"overrides": {"num_layers": 1, "hidden_dim": 16}})
    config = TrainingConfig.from_dict(values)
    dumped = config.to_dict()
    assert set(dumped) == {"task", "output_dir", "data", "model", "train", "distribute"}
    assert dumped["train"]["learning_rate"] == 1.0 and isinstance(
        dumped["train"]["learning_rate"], float)  # an int given for a float is a float
    assert TrainingConfig.from_dict(dumped).to_dict() == dumped
    # A deep copy: editing the dict does not edit the config.
    dumped["model"]["overrides"]["num_layers"] = 99
    dumped["train"]["epochs"] = 1
    assert config.model.overrides == {"num_layers": 1, "hidden_dim": 16}
    assert config.train.epochs == 7


def test_from_file_round_trip_and_default_output_dir(tmp_path):
    (tmp_path / "train.tsv").write_text("a\t1\n")
    path = write_config(tmp_path, "task: ner\ndata:\n  train: train.tsv\n"
                                  "model:\n  preset: bert_tiny\n  use_crf: true\n",
                        name="my_run.yaml")
    config = TrainingConfig.from_file(path)
    assert config.source == str(path)
    assert config.output_dir == str(pathlib.Path("runs") / "my_run")
    assert config.data.train == str(tmp_path / "train.tsv")
    again = TrainingConfig.from_dict(config.to_dict())
    assert again.to_dict() == config.to_dict()


# --- file errors -------------------------------------------------------------------------


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found: .*nowhere.yaml"):
        TrainingConfig.from_file("/nonexistent/nowhere.yaml")


@pytest.mark.parametrize("text, line", [
    ("task: classification\ndata:\n  train: [a, b\nmodel: {}\n", 4),
    ("task: classification\ntrain:\n  epochs: 3\n   seed: 1\n", 4),
    ("task: 'unclosed\n", 2),
])
def test_invalid_yaml_names_file_and_line(tmp_path, text, line):
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_file(path)
    assert info.value.where == f"{path}:{line}"
    assert str(info.value).startswith(f"{path}:{line}: invalid YAML")


def test_yaml_error_is_on_the_line_pyyaml_reports(tmp_path):
    # Independent check of the line number: PyYAML's own mark, 0-based, plus one.
    import yaml

    text = "task: classification\ndata:\n  train: x\n  dev: [\n"
    path = write_config(tmp_path, text)
    with pytest.raises(yaml.YAMLError) as yaml_info:
        yaml.safe_load(text)
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_file(path)
    assert info.value.where == f"{path}:{yaml_info.value.problem_mark.line + 1}"


@pytest.mark.parametrize("text", ["- task\n- data\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=r"a config is a mapping of sections\. Received:"):
        TrainingConfig.from_file(path)


def test_empty_file_reports_the_required_task(tmp_path):
    path = write_config(tmp_path, "")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: `task` is required")):
        TrainingConfig.from_file(path)


# --- schema errors ------------------------------------------------------------------------


def test_unknown_key_names_the_key_and_the_file(tmp_path):
    path = write_config(tmp_path, "task: classification\ndata: {train: t.tsv}\n"
                                  "model: {preset: bert_tiny}\ntrain:\n  epoch: 3\n")
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unknown key `train.epoch`")
    assert "'epochs'" in message  # the known keys are listed
    assert info.value.where == str(path)


def test_unknown_top_level_key():
    with pytest.raises(ConfigError, match=r"unknown key `optimizer`\. Known keys here: "
                                          r"\['data', 'distribute', 'model', 'output_dir'"):
        TrainingConfig.from_dict(minimal(optimizer={"name": "sgd"}))


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"`train` must be a mapping\. Received: 5"):
        TrainingConfig.from_dict(minimal(train=5))


@pytest.mark.parametrize("section, key, value, expected", [
    ("train", "epochs", "3", "int"),
    ("train", "epochs", 2.0, "int"),
    ("train", "epochs", True, "int"),  # bool is not an int here
    ("train", "learning_rate", "fast", "float"),
    ("train", "deterministic", "yes", "bool"),
    ("train", "deterministic", 1, "bool"),
    ("data", "text_column", 1.5, "str or int"),
    ("data", "train", 3, "str or dict"),
    ("model", "overrides", [1, 2], "dict"),
    ("distribute", "logical_cpu_devices", "2", "int"),
])
def test_wrong_type(section, key, value, expected):
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_dict(minimal(**{section: {key: value}}))
    message = str(info.value)
    assert f"`{section}.{key}` must be {expected} (" in message
    assert message.endswith(f"Received: {section}.{key}={value!r}")


def test_task_type_and_choice():
    with pytest.raises(ConfigError, match=r"`task` must be str .*Received: task=None"):
        TrainingConfig.from_dict(minimal(task=None))
    with pytest.raises(ConfigError, match=re.escape(
            "`task` must be one of ['classification', 'ner', 'mlm', 'causal_lm', 'seq2seq', "
            "'permutation_lm', 'transformer_xl_lm']. "
            "Received: task='regression'")):
        TrainingConfig.from_dict(minimal(task="regression"))


@pytest.mark.parametrize("section, key, value", [
    ("train", "decay", "exponential"),
    ("train", "runner", "keras"),
    ("train", "mixed_precision", "float16"),
    ("distribute", "strategy", "parameter_server"),
])
def test_bad_choice(section, key, value):
    with pytest.raises(ConfigError, match=re.escape(
            f"`{section}.{key}` must be one of [") + r".*" + re.escape(
            f"Received: {section}.{key}={value!r}")):
        TrainingConfig.from_dict(minimal(**{section: {key: value}}))


@pytest.mark.parametrize("section, key, value, minimum", [
    ("train", "epochs", 0, 1),
    ("train", "max_steps", 0, 1),
    ("train", "learning_rate", 0.0, 1e-12),
    ("train", "warmup_steps", -1, 0),
    ("train", "gradient_accumulation_steps", 0, 1),
    ("train", "keep_checkpoints", 0, 1),
    ("data", "max_length", 3, 4),
    ("data", "max_train_examples", 0, 1),
    ("model", "vocabulary_size", 15, 16),
    ("distribute", "logical_cpu_devices", 0, 1),
])
def test_minimum(section, key, value, minimum):
    with pytest.raises(ConfigError, match=re.escape(f"`{section}.{key}` must be >= {minimum}")
                       + r".*" + re.escape(f"Received: {section}.{key}={value!r}")):
        TrainingConfig.from_dict(minimal(**{section: {key: value}}))


@pytest.mark.parametrize("section, key, value, maximum", [
    ("model", "dropout", 0.95, 0.9),
    ("data", "mask_rate", 1.5, 1.0),
    ("train", "warmup_ratio", 1.2, 1.0),
    ("train", "end_learning_rate_ratio", 2.0, 1.0),
    ("train", "beta_1", 1.0, 0.9999),
    ("train", "beta_2", 1.0, 0.99999),
])
def test_maximum(section, key, value, maximum):
    with pytest.raises(ConfigError, match=re.escape(f"`{section}.{key}` must be <= {maximum}")
                       + r".*" + re.escape(f"Received: {section}.{key}={value!r}")):
        TrainingConfig.from_dict(minimal(**{section: {key: value}}))


def test_rates_below_their_range_are_rejected():
    for section, key, value in [("model", "dropout", -0.1), ("data", "mask_rate", 0.0)]:
        with pytest.raises(ConfigError, match=re.escape(f"`{section}.{key}` must be >=")):
            TrainingConfig.from_dict(minimal(**{section: {key: value}}))


def test_values_at_the_minimum_and_null_optionals_are_accepted():
    config = TrainingConfig.from_dict(minimal(
        train={"epochs": 1, "warmup_steps": 0, "learning_rate": 1e-12, "max_steps": None,
               "clipnorm": None},
        data={"max_length": 4}))
    assert (config.train.epochs, config.train.warmup_steps, config.data.max_length) == (1, 0, 4)
    assert config.train.learning_rate == 1e-12 and config.train.clipnorm is None


def test_required_keys():
    with pytest.raises(ConfigError, match=r"`task` is required \(what is trained\)\."):
        TrainingConfig.from_dict({"data": {"train": "t.tsv"}, "model": {"preset": "x"}})
    with pytest.raises(ConfigError, match=r"`data\.train` is required \(training file "):
        TrainingConfig.from_dict({"task": "mlm", "model": {"preset": "x"}})
    with pytest.raises(ConfigError, match=r"`model\.preset` or `model\.checkpoint` is required"):
        TrainingConfig.from_dict({"task": "mlm", "data": {"train": "t.tsv"}})


def test_both_batch_sizes():
    with pytest.raises(ConfigError, match=re.escape(
            "give `train.global_batch_size` or `train.per_replica_batch_size`, not both. "
            "Received: 32 and 8")):
        TrainingConfig.from_dict(minimal(train={"per_replica_batch_size": 8}))
    config = TrainingConfig.from_dict(minimal(train={"global_batch_size": None,
                                                     "per_replica_batch_size": 8}))
    assert (config.train.global_batch_size, config.train.per_replica_batch_size) == (None, 8)


def test_averaging_one_checkpoint_is_an_error_and_budgets_are_checked():
    with pytest.raises(ConfigError, match=re.escape(
            "`train.average_checkpoints: 1` averages nothing: give 0 (off)")):
        TrainingConfig.from_dict(minimal(train={"average_checkpoints": 1}))
    with pytest.raises(ConfigError, match=r"`train\.time_budget_minutes` must be >= 0"):
        TrainingConfig.from_dict(minimal(train={"time_budget_minutes": -5}))
    config = TrainingConfig.from_dict(minimal(train={"average_checkpoints": 5,
                                                     "time_budget_minutes": 90}))
    assert (config.train.average_checkpoints, config.train.time_budget_minutes) == (5, 90)


def test_neither_batch_size(tmp_path):
    path = write_config(tmp_path, "task: classification\ndata: {train: t.tsv}\n"
                                  "model: {preset: bert_tiny}\n"
                                  "train: {global_batch_size: null}\n")
    with pytest.raises(ConfigError, match=re.escape(
            f"{path}: `train.global_batch_size` (or `train.per_replica_batch_size`) "
            "is required.")):
        TrainingConfig.from_file(path)


def test_consistency_errors():
    with pytest.raises(ConfigError, match=r"`model\.checkpoint` imports BERT weights or "
                                          r"continues a run; task 'permutation_lm' starts "
                                          r"from `model\.preset`"):
        TrainingConfig.from_dict(minimal(task="permutation_lm", model={
            "preset": None, "checkpoint": "minilm"}))
    with pytest.raises(ConfigError, match=re.escape(
            "task 'causal_lm' continues a keras-attn train run of its own task (a directory "
            "with model.keras); model.checkpoint=minilm is not one")):
        TrainingConfig.from_dict(minimal(task="causal_lm", model={"preset": None,
                                                                  "checkpoint": "minilm"}))
    with pytest.raises(ConfigError, match=re.escape(
            "`model.quantization_aware` trains the plain language model: "
            "`model.intermediate_layer_losses` and `model.future_targets`")):
        TrainingConfig.from_dict(minimal(task="causal_lm", model={
            "preset": "gpt2_tiny", "quantization_aware": True, "future_targets": 1}))
    with pytest.raises(ConfigError, match=r"`model\.use_crf` is for the tagging tasks "
                                          r"\['ner'\]\. "
                                          r"Received: task='classification'"):
        TrainingConfig.from_dict(minimal(model={"use_crf": True}))
    with pytest.raises(ConfigError, match=r"TPUs train in bfloat16: use "
                                          r"train\.mixed_precision=mixed_bfloat16"):
        TrainingConfig.from_dict(minimal(distribute={"strategy": "tpu"},
                                         train={"mixed_precision": "mixed_float16"}))


# --- overrides ----------------------------------------------------------------------------


@pytest.mark.parametrize("text, key, value", [
    ("train.learning_rate=3e-5", "train.learning_rate", 3e-5),  # YAML 1.1 says str
    ("train.learning_rate=3.0e-5", "train.learning_rate", 3e-5),
    ("train.learning_rate=1E-3", "train.learning_rate", 1e-3),
    ("train.epochs=2", "train.epochs", 2),
    ("train.deterministic=true", "train.deterministic", True),
    ("train.deterministic=False", "train.deterministic", False),
    ("train.max_steps=null", "train.max_steps", None),
    ("train.max_steps=", "train.max_steps", None),
    ("model.overrides={num_layers: 1}", "model.overrides", {"num_layers": 1}),
    ("x.y=[1, 2]", "x.y", [1, 2]),
    ("data.train=data/train.tsv", "data.train", "data/train.tsv"),
    ("train.decay=cosine", "train.decay", "cosine"),
    (" train.seed =7", "train.seed", 7),
    ("output_dir=runs/a=b", "output_dir", "runs/a=b"),  # split at the first '='
])
def test_parse_override(text, key, value):
    parsed_key, parsed = parse_override(text)
    assert parsed_key == key
    assert parsed == value and type(parsed) is type(value)


def test_parse_override_errors():
    with pytest.raises(ConfigError, match=r"^override: an override is `key=value` .*"
                                          r"Received: 'train\.epochs'$"):
        parse_override("train.epochs")
    with pytest.raises(ConfigError, match=r"^override: cannot read the value of "
                                          r"`train\.epochs` as YAML"):
        parse_override("train.epochs=[1,")


def test_overrides_are_applied_and_checked():
    config = TrainingConfig.from_dict(MINIMAL, overrides=[
        "train.learning_rate=3e-5", "train.deterministic=true", "train.clipnorm=null",
        "train.max_steps=10", "model.overrides={num_layers: 1}", ("train.seed", 5)])
    assert config.train.learning_rate == 3e-5
    assert config.train.deterministic is True and config.train.clipnorm is None
    assert config.train.max_steps == 10 and config.train.seed == 5
    assert config.model.overrides == {"num_layers": 1}
    # Later overrides win; a list where an int belongs is a type error, reported as such.
    config = TrainingConfig.from_dict(MINIMAL, overrides=["train.epochs=2", "train.epochs=4"])
    assert config.train.epochs == 4
    with pytest.raises(ConfigError, match=r"`train\.epochs` must be int .*"
                                          r"Received: train\.epochs=\[1, 2\]"):
        TrainingConfig.from_dict(MINIMAL, overrides=["train.epochs=[1, 2]"])


def test_override_creates_missing_and_null_sections(tmp_path):
    config = TrainingConfig.from_dict(MINIMAL, overrides=["distribute.strategy=mirrored"])
    assert config.distribute.strategy == "mirrored"
    path = write_config(tmp_path, "task: mlm\ndata: {train: t.tsv}\nmodel: {preset: b}\n"
                                  "train:\n")
    config = TrainingConfig.from_file(path, overrides=["train.epochs=9"])
    assert config.train.epochs == 9 and config.train.decay == "linear"


@pytest.mark.parametrize("override, bad", [
    ("train.epoch=3", "train.epoch"),
    ("trian.epochs=3", "trian"),
    ("train.epochs.value=3", "train.epochs.value"),
])
def test_unknown_override_key(override, bad):
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_dict(MINIMAL, overrides=[override])
    assert info.value.where == "override"
    assert f"unknown key `{bad}` in override `{override.split('=')[0]}`" in str(info.value)


def test_override_of_a_whole_section():
    with pytest.raises(ConfigError, match=r"`train` is a section; override one of its keys"):
        TrainingConfig.from_dict(MINIMAL, overrides=["train=3"])


def test_override_errors_name_the_override_not_the_file(tmp_path):
    path = write_config(tmp_path, "task: mlm\ndata: {train: t.tsv}\nmodel: {preset: b}\n")
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_file(path, overrides=["train.nope=1"])
    assert info.value.where == "override"


# --- paths ---------------------------------------------------------------------------------


def test_relative_paths_are_resolved_against_the_config_directory(tmp_path):
    config_dir = tmp_path / "configs"
    (config_dir / "data").mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv", "vocab.txt"):
        (config_dir / "data" / name).write_text("x\n")
    (config_dir / "hf_bert").mkdir()
    absolute_test = tmp_path / "elsewhere" / "test.tsv"
    path = write_config(config_dir, f"""
task: classification
data:
  train: data/train.tsv
  dev: data/dev.tsv
  test: {absolute_test}
model:
  checkpoint: hf_bert
  vocabulary: data/vocab.txt
""")
    config = TrainingConfig.from_file(path)
    assert config.data.train == str(config_dir / "data" / "train.tsv")
    assert config.data.dev == str(config_dir / "data" / "dev.tsv")
    assert config.data.test == str(absolute_test)  # absolute: untouched
    assert config.model.vocabulary == str(config_dir / "data" / "vocab.txt")
    assert config.model.checkpoint == str(config_dir / "hf_bert")


def test_relative_paths_not_under_the_config_directory_stay_as_written(tmp_path):
    path = write_config(tmp_path / "configs", "task: classification\n"
                                              "data: {train: repo/data/train.tsv}\n"
                                              "model: {checkpoint: minilm}\n")
    config = TrainingConfig.from_file(path)
    assert config.data.train == "repo/data/train.tsv"  # read from the working directory
    assert config.model.checkpoint == "minilm"  # the package name, not a path


def test_from_dict_resolves_paths_only_with_a_base_dir(tmp_path):
    (tmp_path / "train.tsv").write_text("x\n")
    assert TrainingConfig.from_dict(MINIMAL).data.train == "train.tsv"
    config = TrainingConfig.from_dict(MINIMAL, base_dir=tmp_path)
    assert config.data.train == str(tmp_path / "train.tsv")


def test_paths_are_absolute_when_the_config_is_named_relative_to_the_cwd(tmp_path, monkeypatch):
    # The run saves its config: exporting or continuing it may start in another directory.
    (tmp_path / "configs" / "data").mkdir(parents=True)
    (tmp_path / "configs" / "data" / "train.tsv").write_text("x\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "dev.tsv").write_text("x\n")
    write_config(tmp_path / "configs", "task: classification\n"
                                       "data: {train: data/train.tsv, dev: shared/dev.tsv}\n"
                                       "model: {checkpoint: minilm}\n")
    monkeypatch.chdir(tmp_path)
    config = TrainingConfig.from_file(pathlib.Path("configs") / "config.yaml")
    assert config.data.train == str(tmp_path / "configs" / "data" / "train.tsv")
    assert config.data.dev == str(tmp_path / "shared" / "dev.tsv")  # found from the cwd


@pytest.mark.parametrize("path", sorted((pathlib.Path(__file__).parent.parent / "training")
                                        .glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_are_valid(path):
    """Every example config in training/ passes the schema and names the shared data."""
    config = TrainingConfig.from_file(path)
    assert config.output_dir == f"runs/{path.stem}"
    for split in ("train", "dev"):
        # ../shared/data/<dataset>/<file>, or two such files (seq2seq's aligned line files)
        files = getattr(config.data, split)
        for file in files.values() if isinstance(files, dict) else [files]:
            assert pathlib.Path(file).parent.parent.name == "data"


# --- the sections are declared dataclasses ---------------------------------------------------


def test_every_key_is_a_declared_field_with_help():
    sections = (DataSection, ModelSection, TrainSection, DistributeSection)
    assert [len(dataclasses.fields(section)) for section in sections] == [16, 15, 31, 3]
    names = [f.name for section in sections for f in dataclasses.fields(section)]
    assert len(set(names)) == len(names)  # no key in two sections
    for section in sections:
        for field in dataclasses.fields(section):
            assert field.metadata["help"], f"{section.__name__}.{field.name} has no help"
    config = TrainingConfig.from_dict(MINIMAL)
    assert type(config.train) is TrainSection and type(config.model) is ModelSection
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.epochs = 1  # a checked config stays checked
    assert TrainSection().to_dict() == TrainingConfig.from_dict(MINIMAL).train.to_dict()


def test_a_none_default_accepts_none_through_its_annotation():
    for section in (TrainingConfig, *(f.type for f in dataclasses.fields(TrainingConfig)
                                      if dataclasses.is_dataclass(f.type))):
        for field in config_keys(section):
            if field.default is None:
                assert type(None) in typing.get_args(field.type), field.name
