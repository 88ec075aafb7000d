"""Runs and exports are never replaced silently (`keras_attn.runs.overwrite_guard`): through
`keras-attn train` and `keras-attn export` on a tiny run, and the rule on its own."""

import json

import keras
import pytest

from keras_attn import cli
from keras_attn.runs.overwrite_guard import OverwriteError
from keras_attn.runs.overwrite_guard import check_export_output
from keras_attn.runs.overwrite_guard import check_output_dir
from keras_attn.runs.overwrite_guard import export_identity
from tests.test_training_cli import results_of
from tests.test_training_cli import write_project

pytestmark = pytest.mark.tensorflow


@pytest.mark.slow  # 10-20 s on 2 cores: the slow stage keeps make test within 15 min
def test_train_refuses_another_configuration_resumes_the_same_and_overwrites(tmp_path,
                                                                             capsys):
    config = write_project(tmp_path)
    run = tmp_path / "run"
    # Layer names, which checkpoints match, count up in one process: each run starts from
    # fresh names, as in a new process.
    keras.backend.clear_session()
    assert cli.main(["train", str(config), "--max-steps", "6"]) == 0  # one epoch
    first = (run / "model.keras").read_bytes()
    capsys.readouterr()
    # Another configuration: exit 2, the differences and the choices named, nothing written.
    code = cli.main(["train", str(config), "--max-steps", "6", "--seed", "9",
                     "--set", "model.dropout=0.2", "--strategy", "one_device"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"keras-attn train: error: {run} holds a run of another configuration: " in err
    assert "model.dropout is 0.1 there, 0.2 here; train.seed is 1 there, 9 here." in err
    assert "distribute.strategy" not in err  # where it runs may change on a resume
    assert "--output-dir" in err and "--overwrite" in err and "resume" in err
    assert (run / "model.keras").read_bytes() == first
    assert results_of(run)["config"]["train"]["seed"] == 1
    # The same configuration resumes (from the last checkpoint, at its last step), also when
    # it trains for longer.
    keras.backend.clear_session()
    assert cli.main(["train", str(config), "--max-steps", "7"]) == 0
    assert "resumed from checkpoint at step 6" in capsys.readouterr().out
    # --overwrite replaces the run: trained from scratch with the new configuration.
    (run / "export").mkdir()  # an export made from the replaced run goes with it
    (run / "export" / "export_report.json").write_text(
        json.dumps({"source_run": str(run.resolve())}))
    (run / "notes.txt").write_text("the user's")
    assert cli.main(["train", str(config), "--max-steps", "6", "--seed", "9",
                     "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "--overwrite: removed the earlier run in" in out and "resumed" not in out
    assert results_of(run)["config"]["train"]["seed"] == 9
    assert not (run / "export").exists() and (run / "notes.txt").read_text() == "the user's"


def test_a_run_that_trained_nothing_is_started_again(tmp_path, capsys):
    """A config error found after config.json was written (while building the model) leaves
    a directory with nothing trained: the corrected configuration starts there."""
    config = write_project(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"task": "classification", "seed": 3}))
    (run / "checkpoints").mkdir()
    keras.backend.clear_session()
    assert cli.main(["train", str(config), "--max-steps", "1"]) == 0
    assert results_of(run)["config"]["train"]["seed"] == 1
    capsys.readouterr()
    assert cli.main(["train", str(config), "--max-steps", "1", "--seed", "2"]) == 2
    assert "train.seed is 1 there, 2 here" in capsys.readouterr().err


def test_export_refuses_an_export_of_another_run(tmp_path, capsys):
    export = tmp_path / "export"
    export.mkdir()
    (export / "model_card.json").write_text(json.dumps({"source_run": "/runs/earlier"}))
    (export / "model_fp32.tflite").write_bytes(b"earlier")
    code = cli.main(["export", str(tmp_path / "run"), "--output-dir", str(export)])
    err = capsys.readouterr().err
    assert code == 2
    assert (f"keras-attn export: error: {export} holds an export of another configuration: "
            f"source_run is '/runs/earlier' there, '{(tmp_path / 'run').resolve()}' here. "
            "Nothing was written: give another --output-dir, or add --overwrite") in err
    assert (export / "model_fp32.tflite").read_bytes() == b"earlier"


def test_export_overwrite_removes_the_other_runs_export(tmp_path):
    export = tmp_path / "export"
    (export / "qat").mkdir(parents=True)
    (export / "export_report.json").write_text(json.dumps({"source_run": "/runs/earlier"}))
    (export / "model_fp32.tflite").write_bytes(b"earlier")
    lines = []
    check_export_output(export, tmp_path / "run", overwrite=True, log=lines.append)
    assert list(export.iterdir()) == [] and "/runs/earlier" in lines[0]


def test_an_export_of_the_same_run_is_reused(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "export_report.json").write_text(
        json.dumps({"source_run": str((tmp_path / "run").resolve())}))
    (export / "model_fp32.tflite").write_bytes(b"kept")
    for overwrite in (False, True):
        check_export_output(export, tmp_path / "run", overwrite=overwrite)
        assert (export / "model_fp32.tflite").read_bytes() == b"kept"
    check_export_output(tmp_path / "empty", tmp_path / "run")  # no export: nothing to guard


def test_a_damaged_export_record_is_another_run(tmp_path):
    (tmp_path / "model_card.json").write_text('{"source_run": "/ru')
    assert export_identity(tmp_path) == {
        "source_run": "unreadable (model_card.json is damaged)"}
    with pytest.raises(OverwriteError, match="unreadable"):
        check_export_output(tmp_path, tmp_path / "run")


def test_differences_are_listed_by_dotted_key_and_capped():
    recorded = {"a": {f"k{i}": i for i in range(10)}, "b": 1}
    wanted = {"a": {f"k{i}": i + 1 for i in range(10)}, "b": 1}
    with pytest.raises(OverwriteError) as error:
        check_output_dir("d", recorded, wanted, "a run", "choose", ignore=("a.k9",))
    message = str(error.value)
    assert message.startswith("d holds a run of another configuration: a.k0 is 0 there, "
                              "1 here; a.k1 is 1 there, 2 here;")
    assert "(and 1 more). Nothing was written: choose" in message and "a.k9" not in message
    check_output_dir("d", recorded, wanted, "a run", "", ignore=[f"a.k{i}" for i in range(10)])
