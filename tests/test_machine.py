import builtins
import platform

from keras_attn.machine import cpu_description
from keras_attn.machine import cpu_flags
from keras_attn.machine import cpu_model


def _fake_cpuinfo(tmp_path, monkeypatch, flags="avx2"):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                       f"model name\t: AMD EPYC 7B13 64-Core Processor\nflags\t: {flags}\n")
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        return real_open(cpuinfo if path == "/proc/cpuinfo" else path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)


def test_cpu_model_reads_the_model_name_line(tmp_path, monkeypatch):
    _fake_cpuinfo(tmp_path, monkeypatch)
    assert cpu_model() == "AMD EPYC 7B13 64-Core Processor"


def test_cpu_description_names_missing_avx512_and_vnni(tmp_path, monkeypatch):
    _fake_cpuinfo(tmp_path, monkeypatch, flags="fpu sse2 avx2 fma avx512_vnni_x")
    assert cpu_flags() == ("avx2", "fma")
    assert cpu_description() == "AMD EPYC 7B13 64-Core Processor (avx2 fma; no AVX-512, no VNNI)"


def test_cpu_description_of_an_avx512_vnni_bf16_cpu(tmp_path, monkeypatch):
    _fake_cpuinfo(tmp_path, monkeypatch, flags="avx512_bf16 avx2 avx512f fma avx512_vnni")
    assert cpu_description() == ("AMD EPYC 7B13 64-Core Processor "
                                 "(avx2 fma avx512f avx512_vnni avx512_bf16)")


def test_cpu_model_falls_back_to_platform_without_cpuinfo(monkeypatch):
    def no_file(path, *args, **kwargs):
        raise FileNotFoundError(path)

    monkeypatch.setattr(builtins, "open", no_file)
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert cpu_model() == "arm64"
