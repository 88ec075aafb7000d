"""`keras-attn quantize RUN`: the stage that turns a float classification or NER run (a CRF
tagger included) into a quantization-aware (QAT) run directory, which `keras-attn export`
converts to `model_int8.tflite`.

With the default `QuantizationRecipe` (the measured best) the stage only calibrates: it
makes the quantization-aware copy of the run's model (`quantize_model` with the recipe's
layout, a `QuantizedModel`) and sets its activation ranges from the inference-mode min/max of
training examples; the ops an int8 budget moved to float are recorded in `metrics.json`
(`float_ops`), so the export stage rebuilds the same `QuantizedModel`. With `qat_epochs > 0` it
fine-tunes that copy with `keras-attn train`'s public entry point, continuing the float run
(`model.checkpoint=RUN`, `model.quantization_aware=true`). Either way the output is a run
directory like any other (`docs/pipeline.md`); its `lineage.json` names the float run and the
recipe. Running it again reuses a finished output made with the same recipe. A CRF tagger's
copy keeps its CRF (float) and fine-tunes through the CRF loss.
"""


from keras_attn import atomic_files
from keras_attn.quantization.quantization_budget import held_out_examples
from keras_attn.quantization.quantization_budget import held_out_score
from keras_attn.quantization.quantization_budget import quantization_budget
from keras_attn.quantization.quantization_sensitivity import SENSITIVITY_EXAMPLES
from keras_attn.quantization.quantization_sensitivity import quantization_sensitivity
from keras_attn.quantization.quantized_model import QuantizedModel
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_directory import lineage_of
from keras_attn.runs.run_lock import run_lock
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.runs.task_registry import task_spec
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import train
from keras_attn.text.labelled_examples import CALIBRATION_BATCH
from keras_attn.text.labelled_examples import id_inputs

__all__ = ["calibration_batches", "quantize_run", "quantized_run_model"]


def quantize_run(run_dir, output_dir, recipe=None, sequence_length=None, log=None):
    """Makes (or reuses) the QAT run directory of a float run.

    Args:
        run_dir: the float `keras-attn train` run (classification or ner, softmax or
            CRF tagger).
        output_dir: the QAT run directory to write.
        recipe: a `QuantizationRecipe`; defaults to the measured best.
        sequence_length: length the calibration examples are padded to (the export's fixed
            length); defaults to the run's (`RunDirectory.sequence_length`).
        log: callable receiving progress lines.

    Returns:
        The `RunDirectory` of the QAT run.
    """
    # One writer per directory (`run_lock`): the QAT run is written, the float run read.
    with run_lock(writes=[output_dir], reads=[run_dir]):
        return _quantize(run_dir, output_dir, recipe, sequence_length, log)


def _quantize(run_dir, output_dir, recipe, sequence_length, log):
    recipe = recipe or QuantizationRecipe()
    log = log or (lambda message: None)
    source, output = RunDirectory(run_dir), RunDirectory(output_dir)
    source.require("model.keras", "config.json", "vocab.txt", "labels.txt",
                   needed_for="quantizing a float run")
    config = source.config()
    _check_quantizable(source, config)
    if (output.path / "metrics.json").is_file():
        _check_same_recipe(output, recipe)
        log(f"QAT model: reusing {output.path} ({recipe.describe()})")
        return output
    length = source.sequence_length(sequence_length)
    if recipe.qat_epochs == 0:
        _calibrate(source, output, config, recipe, length, log)
    else:
        _fine_tune(source, output, config, recipe, length, log)
    return output


def _check_quantizable(source, config):
    if config.task not in DEPLOYABLE_TASKS:
        raise RunDirectoryError(
            f"{source.path}: task {config.task!r} has no int8 model; quantize and export take "
            f"{' and '.join(DEPLOYABLE_TASKS)} runs")
    if config.model.quantization_aware:
        raise RunDirectoryError(
            f"{source.path} is already a QAT run: quantize its float run "
            f"({source.lineage().source})")


def _check_same_recipe(output, recipe):
    recorded = output.lineage().quantization
    if recorded is None or QuantizationRecipe.from_dict(recorded) != recipe:
        raise RunDirectoryError(
            f"{output.path} holds a QAT run made with another recipe ({recorded}); this one "
            f"asks for {recipe.to_dict()}: use another output directory, or delete that one "
            "to quantize again")


def _qat_config(source, output, config, recipe, length):
    """The QAT run's training config: the float run continued with quantization-aware
    training into `output` (what `keras-attn train` would be given to make the same run)."""
    overrides = [
        ("output_dir", str(output.path)), ("model.checkpoint", str(source.path.resolve())),
        ("model.preset", None), ("model.vocabulary", None), ("data.max_length", length),
        *recipe.config_overrides(config.train.learning_rate),
        ("train.warmup_ratio", 0.1), ("train.warmup_steps", None),
        ("train.early_stopping_patience", None),
    ]
    try:
        return TrainingConfig.from_dict(source.recorded_config(), overrides,
                                        source=str(source.file("config.json")))
    except ConfigError as error:
        raise RunDirectoryError(f"{source.path} cannot be continued with quantization-aware "
                                f"training: {error}") from None


def calibration_batches(source, recipe, length):
    """The calibration inputs of a run's QAT model: a seeded sample of the run's training
    examples (`RunDirectory.examples(..., sample=)`), `CALIBRATION_BATCH` at a time."""
    sample = source.examples("train", length, sample=recipe.calibration_examples)
    return [id_inputs(sample[start:start + CALIBRATION_BATCH], length)
            for start in range(0, len(sample), CALIBRATION_BATCH)]


def quantized_run_model(qat_run, recipe, batches):
    """The `QuantizedModel` of a QAT run: its `model.keras` with the recipe's layout, the
    float ops its budget chose (`metrics.json`) and `batches` to calibrate what a later
    budget step adds."""
    return QuantizedModel(qat_run.load_model(), batches,
                          qat_run.metrics().get("float_ops", ()), **recipe.layout())


def _finish(output, qat, metrics):
    output.write_finish(qat.model, {**metrics, "float_ops": list(qat.float_ops)})


def _calibrate(source, output, config, recipe, length, log):
    """The calibrated copy (`calibration_batches`)."""
    batches = calibration_batches(source, recipe, length)
    qat = QuantizedModel.calibrated(source.load_model(), batches, **recipe.layout())
    count = sum(len(batch["token_ids"]) for batch in batches)
    log(f"QAT model calibrated on {count} training examples, no fine-tuning -> "
        f"{output.path}")
    qat, budget = _within_budget(source, qat, recipe, length, batches, log)
    output.write_start(_qat_config(source, output, config, recipe, length),
                       source.tokenizer_settings(),
                       lineage_of(str(source.path.resolve()), recipe.to_dict()))
    for name in ("vocab.txt", "labels.txt"):
        atomic_files.copy_file(source.file(name), output.path / name)
    _finish(output, qat, {"task": config.task, "quantization": recipe.to_dict(),
                          "calibration_examples": count, "sequence_length": length, **budget})


def _fine_tune(source, output, config, recipe, length, log):
    qat_config = _qat_config(source, output, config, recipe, length)
    log(f"quantization-aware fine-tuning: {recipe.describe()} -> {output.path}")
    # The trainer records its own recipe; the stage's (calibration count included) wins.
    train(qat_config, log=lambda message: log("  " + message),
          quantization=recipe)
    if recipe.max_accuracy_drop is not None:  # the fine-tuned model, within the budget
        sample = source.examples("train", length, sample=SENSITIVITY_EXAMPLES)
        batches = [id_inputs(sample, length)]
        qat, budget = _within_budget(source, quantized_run_model(output, recipe, batches),
                                     recipe, length, batches, log)
        _finish(output, qat, {**output.metrics(), **budget})


def _within_budget(source, qat, recipe, length, batches, log):
    """`(qat, {"quantization_budget": record})` with the recipe's `max_accuracy_drop`
    (`quantization_budget` on `held_out_examples`; ops ordered by their sensitivity on the first
    `SENSITIVITY_EXAMPLES` of `batches`, measured only if the recipe misses the budget), or
    `(qat, {})` without a budget."""
    if recipe.max_accuracy_drop is None:
        return qat, {}
    split, examples = held_out_examples(source, recipe, length)
    tagger = task_spec(source.task).token_labels
    float_model = source.load_model()
    crf = float_model.get_layer("crf") if getattr(float_model, "use_crf", False) else None
    rows = []

    def sensitivity():
        rows.extend(quantization_sensitivity(
            qat, batches[:max(1, SENSITIVITY_EXAMPLES // CALIBRATION_BATCH)]))
        return rows

    points = recipe.budget_points(len(examples))
    log(f"int8 budget: at most {points:g} points below float on {len(examples)} {split} "
        "examples")
    chosen, record = quantization_budget(
        qat, sensitivity, held_out_score(examples, length, source.labels(), tagger, crf),
        points, log=lambda message: log("  " + message))
    return chosen, {"quantization_budget": {
        **record, "split": split, "examples": len(examples), "sensitivity": rows,
        "default_budget": recipe.max_accuracy_drop == "default"}}
