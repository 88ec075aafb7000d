import builtins
import platform

from keras_attn.machine import cpu_model


def test_cpu_model_reads_the_model_name_line(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                       "model name\t: AMD EPYC 7B13 64-Core Processor\nflags\t: avx2\n")
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        return real_open(cpuinfo if path == "/proc/cpuinfo" else path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    assert cpu_model() == "AMD EPYC 7B13 64-Core Processor"


def test_cpu_model_falls_back_to_platform_without_cpuinfo(monkeypatch):
    def no_file(path, *args, **kwargs):
        raise FileNotFoundError(path)

    monkeypatch.setattr(builtins, "open", no_file)
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert cpu_model() == "arm64"
