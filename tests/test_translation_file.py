"""`TranslationFile` refuses a file that is not a translation export (its decoding is
tested on a real export in test_translation_exporter.py)."""

import pytest

from keras_attn.export.tflite.translation_file import TranslationFile
from keras_attn.export.tflite.translation_file import TranslationFileError


def test_a_file_without_the_translation_card_is_refused(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"\x08\x00\x00\x00TFL3")
    with pytest.raises(TranslationFileError, match="not a translation file.*model_card"):
        TranslationFile(path)
    with pytest.raises(TranslationFileError, match="not a translation file"):
        TranslationFile(tmp_path / "missing.tflite")
