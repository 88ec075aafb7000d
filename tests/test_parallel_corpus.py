"""read_parallel_files: aligned line files as MT corpora keep them; every misalignment is a
file:line error, nothing dropped silently. The config's {source, target} form."""

import pytest

from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.text.errors import DataError
from keras_attn.text.parallel_corpus import Pair
from keras_attn.text.parallel_corpus import read_parallel_files
from tests.resources import shared_data_file

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_reads_aligned_lines_with_their_numbers(tmp_path):
    de = write(tmp_path / "a.de", ["Ein Hund.", "  Zwei Katzen. ", "", "Ein Baum."])
    en = write(tmp_path / "a.en", ["A dog.", "Two cats.", "", "A tree."])
    pairs, blank = read_parallel_files(de, en)
    assert pairs == [Pair("Ein Hund.", "A dog.", 1), Pair("Zwei Katzen.", "Two cats.", 2),
                     Pair("Ein Baum.", "A tree.", 4)]
    assert blank == [3]


@pytest.mark.parametrize("longer", ["source", "target"])
def test_different_line_counts_name_the_first_unmatched_line(tmp_path, longer):
    de = write(tmp_path / "a.de", ["Eins.", "Zwei.", "Drei."] if longer == "source"
               else ["Eins."])
    en = write(tmp_path / "a.en", ["One."] if longer == "source" else ["One.", "Two."])
    longer_file, line, shorter_end = (("a.de", 2, 1) if longer == "source" else ("a.en", 2, 1))
    with pytest.raises(DataError, match=rf"{longer_file}:{line}: this line has no counterpart"
                                        rf": .* ends at line {shorter_end}"):
        read_parallel_files(de, en)


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_line_empty_on_one_side_is_an_error(tmp_path, side):
    de = write(tmp_path / "a.de", ["Eins.", "" if side == "source" else "Zwei."])
    en = write(tmp_path / "a.en", ["One.", "  " if side == "target" else "Two."])
    empty = "a.de" if side == "source" else "a.en"
    with pytest.raises(DataError, match=rf"{empty}:2: empty line, but line 2 of .* is not"):
        read_parallel_files(de, en)


def test_undecodable_bytes_name_file_and_line(tmp_path):
    de = tmp_path / "a.de"
    de.write_bytes("Eins.\nF\u00fcnf.\n".encode("utf-8") + b"Gr\xfcn.\n")
    en = write(tmp_path / "a.en", ["One.", "Five.", "Green."])
    with pytest.raises(DataError, match=r"a\.de:3: invalid UTF-8"):
        read_parallel_files(de, en)


def test_multi30k_validation_files_align():
    pairs, blank = read_parallel_files(shared_data_file("multi30k/val.de"),
                                       shared_data_file("multi30k/val.en"))
    assert len(pairs) == 1014 and blank == []
    assert pairs[0].line == 1 and pairs[-1].line == 1014


def _config(task, train):
    return {"task": task, "data": {"train": train},
            "model": {"preset": "transformer_tiny" if task == "seq2seq" else "bert_tiny"}}


def test_config_takes_two_files_for_seq2seq_only(tmp_path):
    de = write(tmp_path / "a.de", ["Eins."])
    en = write(tmp_path / "a.en", ["One."])
    config = TrainingConfig.from_dict(_config("seq2seq", {"source": "a.de", "target": "a.en"}),
                                      base_dir=tmp_path)
    assert config.data.train == {"source": str(de), "target": str(en)}
    with pytest.raises(ConfigError, match=r"`data.train` as a mapping .* is for task "
                                          r"'seq2seq'; task 'classification' reads one file"):
        TrainingConfig.from_dict(_config("classification", {"source": "a", "target": "b"}))
    with pytest.raises(ConfigError, match=r"`data.train` names two aligned line files: "
                                          r"\{source: FILE, target: FILE\}"):
        TrainingConfig.from_dict(_config("seq2seq", {"source": "a.de", "english": "a.en"}))
