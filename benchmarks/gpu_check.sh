#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py; docs/benchmarks.md, "GPU check"): writes to $OUT.
exec "${PYTHON:-python3}" "$(dirname "$0")/gpu_check.py" "$@"
