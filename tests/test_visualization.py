import math

import numpy as np

from keras_attn.visualization import plot_attention
from keras_attn.visualization import plot_position_encoding

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_position_encoding_plot_draws_the_formula(tmp_path):
    path = tmp_path / "pe.png"
    table = plot_position_encoding(path, length=20, dim=16)
    expected = np.zeros((20, 16))
    for pos in range(20):
        for i in range(8):
            expected[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / 16))
            expected[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / 16))
    np.testing.assert_allclose(table, expected, atol=1e-5)
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_attention_plot_writes_a_png(tmp_path):
    path = tmp_path / "attention.png"
    probs = np.full((3, 4), 0.25)
    plot_attention(path, probs, ["a", "b", "c"], ["w", "x", "y", "z"], title="head 0")
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
