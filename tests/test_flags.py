"""Settings to flags (`keras_attn.cli.flags`): each setting's flag has its declaration's
name, bounds, choices, unit and help, and parses back to the value the dataclass would hold."""

import argparse
import dataclasses

import pytest

from keras_attn.cli.flags import add_setting_flags
from keras_attn.cli.flags import flag_fields
from keras_attn.cli.flags import settings_from_arguments
from keras_attn.runs.config_schema import setting
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.inference.http_server import ServerLimits


@dataclasses.dataclass(frozen=True)
class Toy:
    count: int = setting(3, minimum=1, help="how many")
    ratio: float = setting(0.5, minimum=0.0, maximum=1.0, help="a share")
    mode: str = setting("a", choices=("a", "b"), help="which mode")
    sizes: tuple = setting((1, 2), nargs="+", parse=int, minimum=1, help="sizes")
    enabled: bool = setting(True, help="turn it off")
    verbose: bool = setting(False, help="say more")
    wait: float = setting(0.25, minimum=0.0, flag="--wait-ms", flag_scale=1000, help="ms")
    hidden: int = setting(1, flag=False, help="not a flag")


def parse(settings, *flags):
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, settings)
    return settings(**settings_from_arguments(settings, parser.parse_args(list(flags))))


def test_unset_flags_give_the_declared_defaults():
    assert parse(Toy) == Toy()
    assert parse(ServerLimits) == ServerLimits()
    assert parse(ExportOptions) == ExportOptions()


def test_each_flag_gives_its_setting():
    toy = parse(Toy, "--count", "7", "--ratio", "1", "--mode", "b", "--sizes", "4", "5",
                "--no-enabled", "--verbose", "--wait-ms", "40")
    assert toy == Toy(count=7, ratio=1.0, mode="b", sizes=(4, 5), enabled=False, verbose=True,
                      wait=0.04)
    assert parse(ServerLimits, "--batch-timeout-ms", "5", "--workers", "3") == ServerLimits(
        batch_timeout=0.005, workers=3)
    options = parse(ExportOptions, "--no-text-tflite", "--latency-threads", "1", "4",
                    "--eval-split", "test", "--sequence-length", "64")
    assert options == ExportOptions(text_tflite=False, latency_threads=(1, 4),
                                    eval_split="test", sequence_length=64)


@pytest.mark.parametrize("flags, message", [
    (["--count", "0"], "expected a positive integer, got 0"),
    (["--count", "x"], "expected a positive integer, got 'x'"),
    (["--ratio", "1.5"], "expected a number >= 0.0 and <= 1.0, got '1.5'"),
    (["--ratio", "nan"], "expected a number >= 0.0 and <= 1.0, got 'nan'"),
    (["--mode", "c"], "invalid choice: 'c'"),
    (["--sizes", "2", "0"], "expected a positive integer, got 0"),
    (["--hidden", "2"], "unrecognized arguments: --hidden 2"),
])
def test_out_of_bounds_values_are_refused_with_the_bound(flags, message, capsys):
    with pytest.raises(SystemExit):
        parse(Toy, *flags)
    assert message in capsys.readouterr().err


def test_the_help_is_the_declaration_s_with_its_default():
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, ServerLimits)
    text = " ".join(parser.format_help().split())
    for field in flag_fields(ServerLimits):
        assert " ".join(field.metadata["help"].split()) in text
    assert "--batch-timeout-ms BATCH_TIMEOUT_MS" in text and "(default: 2.0)" in text
    assert [f.name for f in flag_fields(Toy)] == [
        "count", "ratio", "mode", "sizes", "enabled", "verbose", "wait"]
