"""Pictures of what the layers compute (matplotlib, imported only when plotting)."""

import numpy as np
from keras import ops

from keras_attn.layers.sinusoidal_position_encoding import sinusoidal_table


def plot_position_encoding(path, length=64, dim=128, max_wavelength=10000):
    """Writes the sinusoidal position-encoding matrix as a PNG and returns the matrix.

    Rows are positions, columns are feature indices; sines on even and cosines on odd
    columns (the interleaved layout of the paper, which is why neighbouring columns
    alternate instead of the picture splitting into a sine half and a cosine half).

    Args:
        path: output PNG path.
        length: number of positions (rows).
        dim: `d_model` (columns).
        max_wavelength: the 10000 of the formula.

    Returns:
        The `(length, dim)` numpy array that was drawn.
    """
    plt = _pyplot()
    table = ops.convert_to_numpy(sinusoidal_table(length, dim, max_wavelength))
    fig, (full, zoom) = plt.subplots(
        1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 1]}
    )
    image = full.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto",
                        interpolation="nearest")
    full.set_title(f"PE(pos, 2i) = sin(pos/10000^(2i/{dim})),  PE(pos, 2i+1) = cos(...)")
    full.set_xlabel("feature index (even: sin, odd: cos)")
    full.set_ylabel("position")
    zoom_cols = min(8, dim)
    zoom.imshow(table[:, :zoom_cols], cmap="RdBu", vmin=-1, vmax=1, aspect="auto",
                interpolation="nearest")
    zoom.set_xticks(range(zoom_cols))
    zoom.set_xticklabels(["sin" if c % 2 == 0 else "cos" for c in range(zoom_cols)])
    zoom.set_title(f"first {zoom_cols} columns")
    fig.colorbar(image, ax=[full, zoom], fraction=0.03)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return table


def plot_attention(path, probabilities, query_tokens, key_tokens, title="attention"):
    """Writes one attention-probability matrix `(T, S)` as a labelled heatmap PNG."""
    plt = _pyplot()
    probabilities = np.asarray(probabilities)
    fig, ax = plt.subplots(figsize=(1.0 + 0.45 * len(key_tokens), 1.0 + 0.45 * len(query_tokens)))
    ax.imshow(probabilities, cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(key_tokens)))
    ax.set_xticklabels(key_tokens, rotation=90)
    ax.set_yticks(range(len(query_tokens)))
    ax.set_yticklabels(query_tokens)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title(title)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "Plotting needs matplotlib: `pip install keras-attn[docs]` "
            "(or `pip install 'matplotlib>=3.9,<3.12'`)."
        ) from error
    return plt
