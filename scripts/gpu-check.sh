#!/usr/bin/env bash
# NVML's per-process GPU memory and utilisation against PyTorch's own numbers, on a real GPU.
# Needs an NVIDIA GPU, its driver and PyTorch with CUDA. Exit 0 pass, 1 fail, 2 no usable GPU.
#   scripts/gpu-check.sh [--gib 2] [--seconds 10] [--host-proc /host_proc] [--record FILE]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" "$here/gpu_check.py" "$@"
