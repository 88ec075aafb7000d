"""The header of `keras-attn explain`'s figure: the sentence and the prediction on it, a
classifier's label and probabilities or a tagger's entities coloured in the text."""

import math
import textwrap

_ENTITY_COLOURS = {"PER": "#f4a6a6", "LOC": "#a6d8f4", "ORG": "#b8e6a6", "MISC": "#f4dca6"}
_EXTRA_COLOURS = ("#d6b8f4", "#f4b8e0", "#b8f4ec", "#e0e0a6")


def prediction_header(prediction, text, truncated):
    """A function drawing the top panel (prediction) on a matplotlib axis."""
    cut = f"   ({truncated} word pieces cut)" if truncated else ""

    def classification(ax):
        labels = list(prediction["probabilities"])
        values = [prediction["probabilities"][label] for label in labels]
        best = labels.index(prediction["label"])
        colours = ["#4c72b0" if i == best else "#b0b0b0" for i in range(len(labels))]
        ax.barh(range(len(labels)), values, color=colours)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("probability")
        for i, value in enumerate(values):
            ax.text(min(value + 0.01, 0.9), i, f"{value:.3f}", va="center", fontsize=9)
        _title(ax, f"{_shorten(text)!r}\nprediction: {prediction['label']} "
                   f"({values[best]:.3f}){cut}")

    def ner(ax):
        _draw_entities(ax, prediction, text)
        found = ", ".join(f"{e['text']} [{e['type']}]" for e in prediction["entities"])
        _title(ax, f"entities: {found or 'none'}{cut}")

    def attention_only(ax):
        ax.axis("off")
        _title(ax, f"{_shorten(text)!r}{cut}")

    if prediction is None:
        return attention_only
    return ner if "entities" in prediction else classification


def _title(ax, title, fontsize=11):
    """A title wrapped to the figure width (about 0.55 em per character)."""
    characters = max(30, int(ax.figure.get_figwidth() * 72 / (0.55 * fontsize)))
    wrapped = "\n".join(textwrap.fill(line, characters) for line in title.split("\n"))
    ax.set_title(wrapped, fontsize=fontsize)


def _shorten(text, limit=120):
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _entity_colour(entity_type, types):
    if entity_type in _ENTITY_COLOURS:
        return _ENTITY_COLOURS[entity_type]
    others = [t for t in types if t not in _ENTITY_COLOURS]
    return _EXTRA_COLOURS[others.index(entity_type) % len(_EXTRA_COLOURS)]


def _draw_entities(ax, prediction, text, fontsize=11):
    """The words of the text in a monospace line layout, entities on a coloured box."""
    words = prediction["words"]
    entity_of_word = {}
    for entity in prediction["entities"]:
        for w in range(entity["start_word"], entity["end_word"]):
            entity_of_word[w] = entity["type"]
    types = sorted({e["type"] for e in prediction["entities"]})
    # Words keep their original spacing: column = character offset, wrapped into lines of
    # as many monospace characters (about 0.6 em wide) as the panel holds.
    width_inches = 0.9 * ax.figure.get_figwidth()  # the panel spans the figure
    line_characters = max(20, int(width_inches * 72 / (0.62 * fontsize)))
    first_cut = len(words) - prediction["num_truncated_words"]
    end = words[-1][2] if words else len(text)
    lines = max(1, math.ceil(end / line_characters))
    ax.set_xlim(0, line_characters)
    ax.set_ylim(lines + 0.4, -0.6)
    ax.axis("off")
    for index, (word, start, _) in enumerate(words):
        line, column = divmod(start, line_characters)
        entity_type = entity_of_word.get(index)
        box = None
        if entity_type is not None:
            box = dict(boxstyle="round,pad=0.2", edgecolor="none",
                       facecolor=_entity_colour(entity_type, types))
        # Words the model never saw (cut to the sequence length) are greyed out.
        ax.text(column, line, word, family="monospace", fontsize=fontsize, va="center",
                bbox=box, color="#999999" if index >= first_cut else "black")
    for i, entity_type in enumerate(types):
        ax.text(8 * i, lines + 0.1, entity_type, family="monospace", fontsize=fontsize - 2,
                va="center", bbox=dict(boxstyle="round,pad=0.2", edgecolor="none",
                                       facecolor=_entity_colour(entity_type, types)))
