"""The int8 budget held on the file that ships: `file_within_budget` scores
`model_int8.tflite` itself on LiteRT (XNNPACK) and moves ops to float until it is within
the budget the quantize stage searched on the calibrated twin (`keras-attn export`'s step
between the twin and the artifact steps)."""

import dataclasses
import os

from keras_attn import atomic_files
from keras_attn.export.artifacts import ARTIFACT_STEPS
from keras_attn.export.artifacts import TFLiteStep
from keras_attn.export.file_budget import file_budget
from keras_attn.export.file_budget import file_measures
from keras_attn.quantization.quantization_budget import held_out_examples
from keras_attn.quantization.quantization_budget import held_out_score
from keras_attn.runs.run_lock import run_lock


def file_within_budget(exporter, plan, order):
    """`model_int8.tflite` itself held to the int8 budget (`file_budget`): converted
    (or the one an earlier export wrote) and scored on LiteRT with XNNPACK on the
    budget's held-out examples; while it misses, the next op of `order` (a callable
    returning op names, most sensitive first) moves to float and a file is converted
    again. The last file is also scored on the builtin kernels. Sets
    `plan.int8_model` and `exporter.budget["file"]`, writes a choice beyond the twin's back
    to the export's own QAT run (`qat/`; a `--qat-run` is only scored), and returns the
    chosen model."""
    start = plan.int8_model
    if start is None or not exporter.budget:
        return start
    split, examples = held_out_examples(exporter.source, exporter.recipe, exporter.length)
    same = split == exporter.eval_split and exporter.options.max_eval_examples is None
    scorer = exporter.scorer if same else exporter.scorer.on(examples)
    exporter.log(f"int8 budget on model_int8.tflite (LiteRT, XNNPACK): {len(examples):,} "
                 f"{split} examples")
    step, path = TFLiteStep(), exporter.output_dir / "model_int8.tflite"
    (int8_file,) = [f for f in step.files(plan) if f.file == path.name]
    trials = atomic_files.temporary_path(exporter.output_dir / "file_budget")
    outputs = {}

    def file_of(model):
        return path if model is start else trials / path.name

    def measure_file(model):  # the file `score_file` just scored
        predict, x = step.run_logits(file_of(model), num_threads=1), scorer.latency_input()
        return file_measures(file_of(model), lambda: predict(x))

    def score_file(model, builtin_kernels=False):
        file = file_of(model)
        if not file.is_file():  # the start's file, or a moved model's, in `trials`
            atomic_files.remove(trials)
            step.write(dataclasses.replace(plan, int8_model=model,
                                           output_dir=file.parent), [int8_file])
        outputs[builtin_kernels] = scorer.collect(
            step.run_logits(file, builtin_kernels=builtin_kernels))
        return scorer.score(outputs[builtin_kernels])[exporter.metric]

    crf = exporter.model.get_layer("crf") if exporter.use_crf else None
    # A --qat-run is read, not written: its file is scored, never moved.
    moves = {} if exporter.options.qat_run is None else {"max_moves": 0}
    chosen, record = file_budget(
        start, exporter.budget, score_file,
        held_out_score(examples, exporter.length, exporter.labels, exporter.tagger, crf),
        order, log=lambda line: exporter.log("  " + line), measure_file=measure_file, **moves)
    if not record["within_budget"] and moves:
        exporter.log(f"  model_int8.tflite misses the budget; --qat-run "
                     f"{exporter.qat_run.path} is not changed: export without --qat-run to "
                     "move ops for the file")
    builtin = 100 * score_file(chosen, builtin_kernels=True)
    record.update(split=split, examples=len(examples), builtin_kernels_metric=round(
        builtin, 4), builtin_kernels_drop=round(record["float_metric"] - builtin, 4))
    budget = {**exporter.budget, "file": record}
    if chosen is not start:
        _keep_file_choice(exporter, plan, chosen, budget, trials / path.name)
    chosen.freeze_ranges()  # the roundings of its file, as `RunExporter._int8_model` does
    plan.int8_model = chosen
    # When `same`, the evaluation reuses these scores of the file that stays.
    return chosen, budget, outputs if same else None



def _keep_file_choice(exporter, plan, chosen, budget, trial):
    """The moved model replaces the twin: the files converted from the old one go, the
    QAT run gets the model (so a re-run converts what ships), then the trial file
    becomes `model_int8.tflite`."""
    for step in ARTIFACT_STEPS:
        for f in step.files(plan):
            if f.source == "int8":
                atomic_files.remove(exporter.output_dir / f.file)
    with run_lock(writes=[exporter.qat_run.path]):  # the quantize stage's lock, again
        exporter.qat_run.write_finish(chosen.model, {
            **exporter.qat_run.metrics(), "quantization_budget": budget,
            "float_ops": list(chosen.float_ops)})
    exporter.log(f"  {exporter.qat_run.path / 'model.keras'}: float ops "
                 f"{list(chosen.float_ops)}")
    os.replace(trial, exporter.output_dir / trial.name)
    atomic_files.remove(trial.parent)
