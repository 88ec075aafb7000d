import json

import numpy as np
import pytest

from keras_attn import cli
from keras_attn.stages.reversal_demo import FIRST_DIGIT
from keras_attn.stages.reversal_demo import SEP
from keras_attn.stages.reversal_demo import build_model
from keras_attn.stages.reversal_demo import greedy_decode
from keras_attn.stages.reversal_demo import make_reversal_data
from keras_attn.stages.reversal_demo import recompute_logits
from keras_attn.stages.reversal_demo import run_demo


def test_reversal_data_layout():
    inputs, targets, weights = make_reversal_data(5, 3, seed=0)
    assert inputs.shape == targets.shape == weights.shape == (5, 6)
    digits = inputs[:, :3]
    assert np.all(inputs[:, 3] == SEP)
    np.testing.assert_array_equal(targets[:, 3:], digits[:, ::-1])
    np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])
    np.testing.assert_array_equal(weights, [[0, 0, 0, 1, 1, 1]] * 5)
    assert digits.min() >= FIRST_DIGIT


def test_cached_greedy_decoding_equals_full_recomputation():
    model = build_model(num_digits=3, hidden_dim=16, num_heads=2, num_layers=2)
    inputs, _, _ = make_reversal_data(4, 3, seed=1)
    prompts = inputs[:, :4]
    generated, cached_logits = greedy_decode(model, prompts, 3)
    assert generated.shape == (4, 3)
    np.testing.assert_allclose(cached_logits, recompute_logits(model, prompts, generated),
                               atol=1e-4)
    np.testing.assert_array_equal(generated, cached_logits.argmax(-1))


def test_short_demo_run_writes_its_summary(tmp_path):
    summary = run_demo(tmp_path, num_digits=3, train_examples=256, epochs=1)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["exact_match_after_training"] == summary["exact_match_after_training"]
    assert summary["kv_cache_vs_full_max_abs_logit_difference"] < 1e-4
    assert 0.0 <= summary["mirror_attention"]["mean_probability"] <= 1.0
    for key in ("model", "attention_png", "position_encoding_png"):
        assert (tmp_path / summary["files"][key].split("/")[-1]).exists()


@pytest.mark.slow
def test_default_demo_learns_to_reverse(tmp_path, capsys):
    assert cli.main(["reversal-demo", "--output-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exact_match_after_training"] >= 0.95
    assert summary["mirror_attention"]["mean_probability"] >= 0.8
    assert "exact match, 1000 unseen strings" in capsys.readouterr().out


@pytest.mark.parametrize("argument", ["--digits=0", "--epochs=-1", "--examples=many"])
def test_cli_rejects_bad_numbers(argument, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["reversal-demo", argument])
    assert exit_info.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err
