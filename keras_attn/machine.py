"""`cpu_model`: the CPU name that results, export reports and benchmarks record."""

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
