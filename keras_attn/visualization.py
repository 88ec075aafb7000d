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
    plt = pyplot()
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
    plt = pyplot()
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


def plot_attention_grid(path, maps, tokens, row_labels=None, column_labels=None,
                        header=None, dpi=110):
    """Writes a grid of attention heatmaps (rows x columns of `(n, n)` maps) as one PNG.

    Small multiples on one colour scale (0 to the largest probability drawn, one colour
    bar), the tokens
    on both axes of the left column (queries) and bottom row (keys), so a 6-layer,
    12-head model stays readable: one row per layer, one column per head.

    Args:
        path: output PNG path.
        maps: `(R, C, n, n)` array of attention probabilities (query rows, key columns).
        tokens: list of `n` str, the labels of both axes.
        row_labels: optional list of `R` str (e.g. `"layer 0"`).
        column_labels: optional list of `C` str (e.g. `"head 3"`).
        header: optional callable `header(ax)` drawing a top panel that spans the grid
            (the prediction, in `keras_attn.stages.explain`).
        dpi: resolution of the PNG.

    Returns:
        dict: `panels` (heatmaps drawn), `rows`, `columns`, `vmax` (top of the colour
        scale), `image_size` (width, height in pixels).

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "grid.png")
    >>> maps = np.full((2, 3, 4, 4), 0.25)
    >>> plot_attention_grid(path, maps, ["[CLS]", "a", "b", "[SEP]"])["panels"]
    6
    """
    plt = pyplot()
    maps = np.asarray(maps, dtype="float32")
    _check_grid(maps, tokens, row_labels, column_labels)
    rows, columns, n = maps.shape[0], maps.shape[1], maps.shape[2]
    # Panel side grows with the sentence; tick font shrinks so every piece keeps a row.
    side = float(np.clip(0.11 * n, 1.5, 3.0))
    tick_size = float(np.clip(0.8 * 72 * side / n, 3.0, 8.0))
    header_height = 2.2 if header is not None else 0.0
    # A header needs room for a sentence even above one or two heads.
    width = max(1.8 + side * columns, 9.0 if header is not None else 0.0)
    fig = plt.figure(figsize=(width, 0.8 + side * rows + header_height),
                     layout="constrained")
    # One colour scale for every panel, topped at the largest probability drawn: a fixed
    # 0..1 scale would wash out the typical 0.1-0.5 weights of a trained model.
    vmax = float(max(maps.max(), 1e-6)) if maps.size else 1.0
    height_ratios = ([header_height] if header is not None else []) + [side] * rows
    grid = fig.add_gridspec(len(height_ratios), columns, height_ratios=height_ratios)
    if header is not None:
        header(fig.add_subplot(grid[0, :]))
    first = 1 if header is not None else 0
    heatmaps, image = [], None
    for r in range(rows):
        for c in range(columns):
            ax = fig.add_subplot(grid[first + r, c])
            image = _draw_heatmap(ax, maps[r, c], vmax, tick_size,
                                  x_tokens=tokens if r == rows - 1 else [],
                                  y_tokens=tokens if c == 0 else [])
            if r == 0 and column_labels is not None:
                ax.set_title(column_labels[c], fontsize=10)
            if c == 0 and row_labels is not None:
                ax.set_ylabel(row_labels[r], fontsize=10)
            heatmaps.append(ax)
    fig.colorbar(image, ax=heatmaps, fraction=0.02, shrink=0.6,
                 label="attention probability (row: query, column: key)")
    width, height = fig.get_size_inches() * dpi
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return {"panels": len(heatmaps), "rows": rows, "columns": columns, "vmax": vmax,
            "image_size": (int(round(width)), int(round(height)))}


def _check_grid(maps, tokens, row_labels, column_labels):
    """`maps` is `(rows, columns, n, n)` with `n = len(tokens)`, and each label list has one
    entry per row or column."""
    if maps.ndim != 4 or maps.shape[2] != maps.shape[3] or maps.shape[2] != len(tokens):
        raise ValueError(
            "`maps` must be (rows, columns, n, n) with n = len(tokens). Received: "
            f"maps.shape={maps.shape}, len(tokens)={len(tokens)}"
        )
    for name, labels, count in (("row_labels", row_labels, maps.shape[0]),
                                ("column_labels", column_labels, maps.shape[1])):
        if labels is not None and len(labels) != count:
            raise ValueError(f"`{name}` needs {count} entries. Received: {len(labels)}")


def _draw_heatmap(ax, probabilities, vmax, tick_size, x_tokens, y_tokens):
    """One `(n, n)` map on `ax` (colour scale 0..vmax), the tokens on the axes that get
    them; returns the image, for the colour bar."""
    n = len(probabilities)
    image = ax.imshow(probabilities, cmap="viridis", vmin=0.0, vmax=vmax,
                      interpolation="nearest")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(x_tokens, rotation=90, fontsize=tick_size)
    ax.set_yticklabels(y_tokens, fontsize=tick_size)
    ax.tick_params(length=0)
    return image


def plot_position_embeddings(path, table, title="learned position embeddings"):
    """Writes a `(T, d)` position table and the cosine similarity of its rows as a PNG.

    For learned tables (BERT's `position_embedding`) the similarity matrix is the telling
    picture: a bright band around the diagonal means neighbouring positions got similar
    vectors, i.e. the model learned locality.

    Args:
        path: output PNG path.
        table: `(T, d)` array, one row per position.
        title: str, the title of the left panel.

    Returns:
        The `(T, T)` cosine-similarity matrix that was drawn.
    """
    plt = pyplot()
    table = np.asarray(table, dtype="float64")
    if table.ndim != 2:
        raise ValueError(f"`table` must be (positions, dim). Received: shape={table.shape}")
    norms = np.linalg.norm(table, axis=1, keepdims=True)
    unit = table / np.maximum(norms, 1e-12)
    similarity = unit @ unit.T  # (T, T)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6),
                                      gridspec_kw={"width_ratios": [2, 1]})
    limit = float(np.abs(table).max()) or 1.0
    image = left.imshow(table, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto",
                        interpolation="nearest")
    left.set_title(title)
    left.set_xlabel("feature index")
    left.set_ylabel("position")
    fig.colorbar(image, ax=left, fraction=0.04)
    image = right.imshow(similarity, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    right.set_title("cosine similarity of positions")
    right.set_xlabel("position")
    right.set_ylabel("position")
    fig.colorbar(image, ax=right, fraction=0.046)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return similarity


def plot_quantization_sensitivity(path, rows, float_ops=()):
    """A bar per int8 op: the SNR of the logits with only that op in int8 (higher is
    better; `quantization_sensitivity` rows, most sensitive at the top), the recipe's
    own SNR as a line, and the ops an int8 budget moved to float in grey.

        SNR_dB = 10 log10( sum(z_float^2) / sum((z_op - z_float)^2) )

    Args:
        path: the PNG file to write.
        rows: `quantization_sensitivity` rows (`"all"` first, then one per op).
        float_ops: names of ops drawn as moved to float (their rows, if any, in grey).

    Returns:
        The number of op bars drawn.

    Example:
    >>> import os, tempfile
    >>> rows = [{"op": "all", "snr_db": 20.0}, {"op": "logits", "snr_db": 25.0}]
    >>> plot_quantization_sensitivity(os.path.join(tempfile.mkdtemp(), "s.png"), rows)
    1
    """
    plt = pyplot()
    ops = [row for row in rows if row["op"] != "all"]
    recipe = [row["snr_db"] for row in rows if row["op"] == "all"]
    fig, ax = plt.subplots(figsize=(7, 0.25 * len(ops) + 1.4))
    colors = ["0.7" if row["op"] in float_ops else "tab:blue" for row in ops]
    ax.barh(range(len(ops)), [row["snr_db"] for row in ops], color=colors)
    ax.set_yticks(range(len(ops)), [row["op"] for row in ops], fontsize=7)
    ax.invert_yaxis()  # the most sensitive (lowest SNR) at the top
    if recipe:
        ax.axvline(recipe[0], color="tab:red", linestyle="--",
                   label=f"the whole recipe: {recipe[0]:.1f} dB")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_xlabel("SNR of the logits with only this op in int8 (dB; lower = more error)")
    ax.set_title("int8 sensitivity per op", fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return len(ops)


def pyplot():
    """`matplotlib.pyplot` on the non-interactive Agg backend (PNG files, no display).

    The plotting functions here call it first; call it yourself to fail early, before
    expensive work whose result is to be plotted.

    Returns:
        The `matplotlib.pyplot` module.

    Raises:
        ImportError: matplotlib is not installed; the message names the `docs` extra that
            brings it (`pip install keras-attn[docs]`).

    Example:
    >>> pyplot().get_backend().lower()
    'agg'
    """
    try:
        # optional: matplotlib is only in the `docs` extra, needed for plotting alone
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "Plotting needs matplotlib: `pip install keras-attn[docs]` "
            "(or `pip install 'matplotlib>=3.9,<3.12'`)."
        ) from error
    return plt
