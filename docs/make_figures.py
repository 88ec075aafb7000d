"""Regenerates the figures of docs/ (`make docs-figures`)."""

import pathlib

from keras_attn.visualization import plot_position_encoding

IMAGES = pathlib.Path(__file__).resolve().parent / "images"


def main():
    IMAGES.mkdir(exist_ok=True)
    plot_position_encoding(IMAGES / "sinusoidal_position_encoding.png", length=64, dim=128)


if __name__ == "__main__":
    main()
