"""`cpu_model` and `cpu_description`: the CPU that results, export reports and benchmarks record."""

import platform


def cpu_model():
    """The CPU's model name from `/proc/cpuinfo` (Linux), else what `platform` reports.

    Returns:
        str, e.g. `"AMD EPYC 7B13"`.

    Example:
    >>> isinstance(cpu_model(), str)
    True
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# The CPU flags that decide which int8/bf16 kernels oneDNN and XNNPACK can use.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
                "amx_int8", "amx_bf16")


def cpu_flags():
    """The `KERNEL_FLAGS` this CPU has, from `/proc/cpuinfo` (empty where it is missing).

    Returns:
        tuple of str, in `KERNEL_FLAGS` order.

    Example:
    >>> set(cpu_flags()) <= set(KERNEL_FLAGS)
    True
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return tuple(flag for flag in KERNEL_FLAGS if flag in present)
    except OSError:
        pass
    return ()


def cpu_description():
    """The CPU's name and the kernel flags it has, for every latency or throughput report:
    int8 speed depends on VNNI and bf16 speed on AVX-512 BF16 / AMX.

    Returns:
        str, e.g. `"AMD EPYC (avx2 fma; no AVX-512, no VNNI)"`.

    Example:
    >>> cpu_description().startswith(cpu_model())
    True
    """
    flags = cpu_flags()
    notes = []
    if "avx512f" not in flags:
        notes.append("no AVX-512")
    if not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags):
        notes.append("no VNNI")
    detail = " ".join(flags) or "flags unknown"
    return f"{cpu_model()} ({detail}{'; ' + ', '.join(notes) if notes else ''})"
