"""Dataset readers: classification (TSV/CSV/JSONL), CoNLL, raw text, label vocabularies."""

import json
import tracemalloc

import pytest
import tensorflow as tf

from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.conll_reader import iob1_to_iob2
from keras_attn.text.errors import DataError
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.raw_text_reader import RawTextReader
from tests.resources import shared_data_file

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow


def write(tmp_path, name, text):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --- classification ------------------------------------------------------------------------------


def test_tsv_with_header_by_name_and_pair(tmp_path):
    path = write(tmp_path, "pairs.tsv", "id\tq1\tq2\tlabel\n7\ta \"quoted\" text\tb\tyes\n"
                                       "8\tc\td\tno\n\n")
    reader = ClassificationReader(path, text_column="q1", text_pair_column="q2",
                                  label_column="label")
    examples = list(reader)
    assert [(e.text, e.text_pair, e.label, e.line) for e in examples] == [
        ('a "quoted" text', "b", "yes", 2), ("c", "d", "no", 3)]
    assert reader.report.as_dict() == {"examples": 2, "blank_lines_skipped": 1}


def test_tsv_header_false_by_index_and_infer(tmp_path):
    path = write(tmp_path, "a.tsv", "good\t1\nbad\t0\n")
    # "infer" with columns by index: no header, the first row is data.
    assert [(e.text, e.label) for e in ClassificationReader(path)] == [("good", "1"), ("bad", "0")]
    reader = ClassificationReader(path, text_column=0, label_column=1, header=True)
    assert [(e.text, e.label, e.line) for e in reader] == [("bad", "0", 2)]
    with pytest.raises(ValueError, match="need a header row.*header=False"):
        ClassificationReader(path, text_column="sentence", header=False)


def test_csv_quoting_spans_lines(tmp_path):
    path = write(tmp_path, "a.csv", 'text,label\n"hello, world",pos\n"two\nlines",neg\nlast,pos\n')
    examples = list(ClassificationReader(path, text_column="text", label_column="label"))
    assert [(e.text, e.label, e.line) for e in examples] == [
        ("hello, world", "pos", 2), ("two\nlines", "neg", 3), ("last", "pos", 5)]


def test_jsonl_keys_and_integer_labels(tmp_path):
    rows = [{"body": "nice", "stars": 5}, {"body": "meh", "stars": 2, "extra": [1]}]
    path = write(tmp_path, "a.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    reader = ClassificationReader(path, text_column="body", label_column="stars")
    assert [(e.text, e.label) for e in reader] == [("nice", "5"), ("meh", "2")]
    vocabulary = reader.build_label_vocabulary()
    assert vocabulary.labels == ("2", "5")
    batch = next(iter(reader.as_dataset(vocabulary).batch(2)))
    assert batch["label"].numpy().tolist() == [1, 0]
    assert [t.decode() for t in batch["text"].numpy()] == ["nice", "meh"]


def test_unlabelled_reader(tmp_path):
    path = write(tmp_path, "a.tsv", "sentence\nhello\n")
    reader = ClassificationReader(path, text_column="sentence", label_column=None)
    assert [e.text for e in reader] == ["hello"]
    assert reader.output_signature().keys() == {"text"}
    assert [x["text"].numpy() for x in reader.as_dataset()] == [b"hello"]


def test_reader_is_lazy(tmp_path):
    # Line 4 is not UTF-8: a reader that loaded the whole file would fail before the first
    # example; a streaming one yields the first examples and fails only when it gets there.
    path = write(tmp_path, "lazy.tsv", b"sentence\tlabel\na\t0\nb\t1\n\xff\xfe\t0\n")
    iterator = iter(ClassificationReader(path, text_column="sentence", label_column="label"))
    assert next(iterator).text == "a"
    assert next(iterator).text == "b"
    with pytest.raises(DataError, match=r"lazy\.tsv:4: invalid UTF-8"):
        next(iterator)
    dataset = ClassificationReader(path, text_column="sentence", label_column="label")
    dataset = dataset.as_dataset(LabelVocabulary(["0", "1"]))
    iterator = iter(dataset)
    assert next(iterator)["text"].numpy() == b"a"
    assert next(iterator)["text"].numpy() == b"b"
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"lazy\.tsv:4: invalid UTF-8"):
        next(iterator)


def test_reader_memory_does_not_grow_with_file_size(tmp_path):
    # ~6 MB of TSV; a reader holding the file (or its examples) would allocate megabytes.
    path = tmp_path / "big.tsv"
    with open(path, "w") as file:
        file.write("sentence\tlabel\n")
        for i in range(100_000):
            file.write(f"example sentence number {i} with some filler words\t{i % 2}\n")
    reader = ClassificationReader(path, text_column="sentence", label_column="label")
    tracemalloc.start()
    count = sum(1 for _ in reader)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 100_000 and path.stat().st_size > 5_000_000
    assert peak < 500_000, peak


# --- classification errors -----------------------------------------------------------------------


def test_missing_column_in_header(tmp_path):
    path = write(tmp_path, "dev.tsv", "sentence\tlabel\nok\t1\n")
    with pytest.raises(DataError, match=r"dev\.tsv:1: missing column: the header has no column "
                                        r"'text'.*\['sentence', 'label'\]"):
        list(ClassificationReader(path, text_column="text", label_column="label"))


def test_missing_column_in_row(tmp_path):
    path = write(tmp_path, "dev.tsv", "a\t1\nb\t0\nonly text\n")
    with pytest.raises(DataError, match=r"dev\.tsv:3: missing column: `label_column=1`.*"
                                        r"the row has 1"):
        list(ClassificationReader(path, text_column=0, label_column=1))


def test_missing_jsonl_key_and_invalid_json(tmp_path):
    path = write(tmp_path, "a.jsonl", '{"text": "x", "label": "p"}\n{"text": "y"}\n')
    with pytest.raises(DataError, match=r"a\.jsonl:2: missing column: no key 'label'"):
        list(ClassificationReader(path))
    path = write(tmp_path, "b.jsonl", '{"text": "x", "label": "p"}\n{"text": "y",\n')
    with pytest.raises(DataError, match=r"b\.jsonl:2: invalid JSON"):
        list(ClassificationReader(path))


def test_unknown_label_at_evaluation(tmp_path):
    train = write(tmp_path, "train.tsv", "sentence\tlabel\na\tpos\nb\tneg\n")
    dev = write(tmp_path, "dev.tsv", "sentence\tlabel\nc\tpos\nd\tneutral\n")
    vocabulary = ClassificationReader(train, "sentence", "label").build_label_vocabulary()
    reader = ClassificationReader(dev, "sentence", "label")
    with pytest.raises(DataError, match=r"dev\.tsv:3: unknown label 'neutral'.*'neg', 'pos'"):
        list(reader.encoded(vocabulary))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dev\.tsv:3: unknown label"):
        list(reader.as_dataset(vocabulary))


def test_empty_file_and_invalid_utf8(tmp_path):
    path = write(tmp_path, "empty.tsv", "")
    with pytest.raises(DataError, match=r"empty\.tsv:1: the file is empty"):
        list(ClassificationReader(path))
    path = write(tmp_path, "latin1.tsv", "caf\xe9\t1\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.tsv:1: invalid UTF-8 at byte 3"):
        list(ClassificationReader(path))


def test_argument_validation(tmp_path):
    with pytest.raises(ValueError, match="file_format"):
        ClassificationReader(tmp_path / "a.txt")
    with pytest.raises(ValueError, match="header"):
        ClassificationReader(tmp_path / "a.tsv", header="yes")
    with pytest.raises(ValueError, match="text_column"):
        ClassificationReader(tmp_path / "a.jsonl", text_column=0)


# --- label vocabulary ----------------------------------------------------------------------------


def test_label_vocabulary_order_save_load_config(tmp_path):
    vocabulary = LabelVocabulary.build(["10", "2", "1", "2"])
    assert vocabulary.labels == ("1", "2", "10")  # integer labels by value
    tags = LabelVocabulary.build([["I-PER", "O"], ["B-PER", "B-LOC"]])
    assert tags.labels == ("O", "B-LOC", "B-PER", "I-PER")
    path = tags.save(tmp_path / "model")
    assert path.name == "labels.txt"
    assert path.read_text() == "O\nB-LOC\nB-PER\nI-PER\n"
    assert LabelVocabulary.load(tmp_path / "model") == tags
    assert LabelVocabulary.load(path) == tags
    config = json.loads(json.dumps(tags.get_config()))
    assert LabelVocabulary.from_config(config) == tags
    assert tags.encode(["B-PER", "O"]) == [2, 0] and tags.decode([3]) == ["I-PER"]
    with pytest.raises(KeyError, match="unknown label 'B-ORG'"):
        tags.id("B-ORG")
    with pytest.raises(ValueError, match="Duplicate label 'a'"):
        LabelVocabulary(["a", "a"])
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        tags.decode([4])


# --- CoNLL ---------------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC


Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


def test_conll_reader_sentences_and_report(tmp_path):
    path = write(tmp_path, "train.txt", CONLL)
    reader = ConllReader(path)
    sentences = list(reader)
    assert [s.tokens for s in sentences] == [["EU", "rejects", "German"],
                                             ["Peter", "Blackburn"], ["BRUSSELS"]]
    assert [s.tags for s in sentences] == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"],
                                           ["B-LOC"]]
    assert [s.line for s in sentences] == [3, 8, 12]
    assert reader.report.as_dict() == {"docstart_lines_skipped": 2, "empty_sentences_skipped": 3,
                                       "sentences": 3, "tokens": 6}
    # Tag in a chosen column (the chunk tag) and untagged reading.
    chunks = [s.tags for s in ConllReader(path, tag_column=2)]
    assert chunks[1] == ["B-NP", "I-NP"]
    assert [s.tags for s in ConllReader(path, tag_column=None)] == [None] * 3
    vocabulary = reader.build_label_vocabulary()
    assert vocabulary.labels == ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER")
    batch = next(iter(reader.as_dataset(vocabulary)))
    assert batch["tokens"].numpy().tolist() == [b"EU", b"rejects", b"German"]
    assert batch["tags"].numpy().tolist() == [3, 0, 2]


def test_iob1_to_iob2():
    # IOB1: an entity starts with I-; B- only separates two adjacent entities of one type.
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG", "B-ORG", "I-ORG"]
    assert iob1_to_iob2(iob1) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG",
                                  "B-ORG", "I-ORG"]


def test_conll_iob1_scheme(tmp_path):
    path = write(tmp_path, "iob1.txt", "U.N. I-ORG\nofficial O\nEkeus I-PER\nheads O\n"
                                       "for O\nBaghdad I-LOC\n")
    assert next(iter(ConllReader(path, scheme="iob1"))).tags == [
        "B-ORG", "O", "B-PER", "O", "O", "B-LOC"]
    with pytest.raises(DataError, match=r"iob1\.txt:1: invalid IOB2: 'I-ORG' follows 'O'.*"
                                        r"scheme='iob1'"):
        list(ConllReader(path, scheme="iob2"))


def test_conll_errors(tmp_path):
    path = write(tmp_path, "bad.txt", "EU B-ORG\n\nPeter B_PER\n")
    with pytest.raises(DataError, match=r"bad\.txt:3: malformed tag 'B_PER'"):
        list(ConllReader(path))
    path = write(tmp_path, "short.txt", "EU B-ORG\nrejects\n")
    with pytest.raises(DataError, match=r"short\.txt:2: missing column: `tag_column=-1`"):
        list(ConllReader(path))
    path = write(tmp_path, "empty.txt", "")
    with pytest.raises(DataError, match=r"empty\.txt:1: the file is empty"):
        list(ConllReader(path))
    path = write(tmp_path, "docs.txt", "-DOCSTART- O\n\n")
    with pytest.raises(DataError, match=r"docs\.txt:1: the file holds no sentence"):
        list(ConllReader(path))
    path = write(tmp_path, "utf.txt", b"EU B-ORG\n\nM\xfcller B-PER\n")
    with pytest.raises(DataError, match=r"utf\.txt:3: invalid UTF-8"):
        list(ConllReader(path))
    train = write(tmp_path, "train.txt", "EU B-ORG\n")
    valid = write(tmp_path, "valid.txt", "EU B-ORG\nrejects O\n\nPeter B-PER\n")
    vocabulary = ConllReader(train).build_label_vocabulary()
    with pytest.raises(DataError, match=r"valid\.txt:2: unknown label 'O'"):
        list(ConllReader(valid).encoded(vocabulary))
    vocabulary = LabelVocabulary(["O", "B-ORG"])
    with pytest.raises(DataError, match=r"valid\.txt:4: unknown label 'B-PER'"):
        list(ConllReader(valid).encoded(vocabulary))
    with pytest.raises(ValueError, match="scheme"):
        ConllReader(valid, scheme="bioes")
    with pytest.raises(ValueError, match="tag_column"):
        ConllReader(valid, tag_column=0)


# --- raw text ------------------------------------------------------------------------------------


def test_raw_text_reader(tmp_path):
    path = write(tmp_path, "corpus.txt", "\nA cat sat.\n  It purred.  \n\n\n\nRain fell.\n"
                                         "It stopped.\n\nEnd.")
    reader = RawTextReader(path)
    documents = list(reader)
    assert [d.sentences for d in documents] == [["A cat sat.", "It purred."],
                                                ["Rain fell.", "It stopped."], ["End."]]
    assert [d.line for d in documents] == [2, 7, 10]
    assert reader.report.as_dict() == {"extra_blank_lines_skipped": 3, "sentences": 5,
                                       "documents": 3}
    assert [s.numpy().decode() for s in reader.as_dataset()][2:4] == ["Rain fell.",
                                                                      "It stopped."]
    with pytest.raises(DataError, match=r"blank\.txt:1: the file holds no text"):
        list(RawTextReader(write(tmp_path, "blank.txt", "\n\n")))


# --- the real data -------------------------------------------------------------------------------


@pytest.mark.parametrize("split, count, positives",
                         [("dev", 872, 444), ("test", 1821, 909), ("train", 67349, 37569)])
def test_sst2_counts(split, count, positives):
    reader = ClassificationReader(shared_data_file(f"sst2/{split}.tsv"), text_column="sentence",
                                  label_column="label")
    labels = list(reader.labels())
    assert len(labels) == count
    assert labels.count("1") == positives and labels.count("0") == count - positives
    assert reader.report.as_dict() == {"examples": count}


def test_sst2_dataset_matches_file():
    vocabulary = LabelVocabulary(["0", "1"])
    reader = ClassificationReader(shared_data_file("sst2/dev.tsv"), text_column="sentence",
                                  label_column="label")
    total, positives = 0, 0
    for batch in reader.as_dataset(vocabulary).batch(256):
        total += int(batch["label"].shape[0])
        positives += int(tf.reduce_sum(batch["label"]))
    assert (total, positives) == (872, 444)
    first = (shared_data_file("sst2/dev.tsv")).read_text().splitlines()[1].split("\t")[0]
    assert next(iter(reader.as_dataset(vocabulary)))["text"].numpy().decode() == first


@pytest.mark.parametrize("split, sentences, tokens, entities", [
    ("valid", 3250, 51362, 5942), ("test", 3453, 46435, 5648), ("train", 14041, 203621, 23499)])
def test_conll_counts(split, sentences, tokens, entities):
    reader = ConllReader(shared_data_file(f"conll2003/{split}.txt"))  # scheme iob2: validated
    tags = list(reader.tags())
    assert len(tags) == sentences
    assert sum(len(t) for t in tags) == tokens
    assert sum(tag.startswith("B-") for t in tags for tag in t) == entities
    assert reader.report["sentences"] == sentences and reader.report["tokens"] == tokens
    vocabulary = LabelVocabulary.build(tags)
    assert vocabulary.labels == ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC",
                                 "I-ORG", "I-PER")


# --- data that must not change silently --------------------------------------------------------


def test_tsv_row_with_another_field_count_names_the_line(tmp_path):
    """A tab inside a text made its tail the label (or cut the text with label_column=-1)."""
    path = write(tmp_path, "train.tsv", "sentence\tlabel\ngood film\t1\na tab\there\t0\n")
    for label_column in ("label", -1):
        reader = ClassificationReader(path, text_column=0, label_column=label_column,
                                      header=True)
        with pytest.raises(DataError, match=r"train\.tsv:3: the row has 3 fields, the header "
                                            r"has 2\. A tab inside a text splits it"):
            list(reader)
    csv_path = write(tmp_path, "train.csv", "text,label\ngood,1\nbad, really,0\n")
    with pytest.raises(DataError, match=r"train\.csv:3: the row has 3 fields, the header has 2"
                                        r"\. Quote fields"):
        list(ClassificationReader(csv_path, text_column="text", label_column="label"))


def test_label_with_surrounding_whitespace_is_an_error(tmp_path):
    """`'1 '` became a third class (dev accuracy 0.0, exit 0)."""
    path = write(tmp_path, "train.tsv", "sentence\tlabel\ngood\t1\nbad\t0\nfine\t1 \n")
    with pytest.raises(DataError, match=r"train\.tsv:4: label '1 ' has leading or trailing "
                                        r"whitespace.*write it as '1'"):
        ClassificationReader(path, text_column="sentence",
                             label_column="label").build_label_vocabulary()
    path = write(tmp_path, "a.jsonl", '{"text": "x", "label": " pos"}\n')
    with pytest.raises(DataError, match=r"a\.jsonl:1: label ' pos' has leading"):
        list(ClassificationReader(path))


def test_file_without_examples_is_a_data_error(tmp_path):
    """A header-only TSV was a traceback in `keras-attn train`."""
    path = write(tmp_path, "train.tsv", "sentence\tlabel\n\n")
    with pytest.raises(DataError, match=r"train\.tsv:1: the file holds no example"):
        list(ClassificationReader(path, text_column="sentence", label_column="label"))
    with pytest.raises(DataError, match=r"b\.jsonl:1: the file holds no example"):
        list(ClassificationReader(write(tmp_path, "b.jsonl", "\n\n")))


def test_header_row_read_as_data_with_index_columns_is_an_error(tmp_path):
    """Columns by index with `header: infer` turned the header row into an example."""
    path = write(tmp_path, "train.tsv", "sentence\tlabel\ngood\t1\nbad\t0\nok\t1\n")
    with pytest.raises(DataError, match=r"train\.tsv:1: the label 'label' of the first row "
                                        r"occurs nowhere else: is the first row a header\?"):
        ClassificationReader(path, text_column=0, label_column=1).build_label_vocabulary()
    # Saying so explicitly reads it either way.
    assert ClassificationReader(path, text_column=0, label_column=1,
                                header=True).build_label_vocabulary().labels == ("0", "1")
    assert len(ClassificationReader(path, text_column=0, label_column=1,
                                    header=False).build_label_vocabulary()) == 3


@pytest.mark.parametrize("space", ["\u00a0", "\u0085", "\u2028", "\u3000"])
def test_conll_splits_columns_on_ascii_whitespace_only(tmp_path, space):
    """`str.split()` cut `New<U+00A0>York` in two and dropped `York`."""
    path = write(tmp_path, "a.txt", f"New{space}York B-LOC\nis\tO\n\nx  O \n")
    sentences = list(ConllReader(path))
    assert [(s.tokens, s.tags) for s in sentences] == [
        ([f"New{space}York", "is"], ["B-LOC", "O"]), (["x"], ["O"])]
