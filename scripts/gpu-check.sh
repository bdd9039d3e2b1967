#!/usr/bin/env bash
# The GPU figures on a real NVIDIA machine: sets up a Python for scripts/gpu_check.py, prints
# what nvidia-smi says, then runs the check, which prints the sidecar's own figures beside it:
#   - NVML's per-process memory of a torch child against torch's reserved memory (the check),
#   - each GPU's memory in the sidecar's binary units next to nvidia-smi's MiB,
#   - which GPU the sidecar finds the child on (NVML process list, else CUDA_VISIBLE_DEVICES),
#     checked against the device UUID torch reports,
#   - GPU utilisation polled through the run (UtilizationPoller), as in a snapshot window.
#
#   scripts/gpu-check.sh [--gib 2] [--seconds 10] [--interval 0.5] [--host-proc /host_proc]
#   scripts/gpu-check.sh --record tests/fixtures/nvml/<name>.yaml   # record this machine
#
# Python, first that fits: $PYTHON as given (nothing is installed into it); the checkout's
# .venv when it has pynvml, PyYAML and torch; else a venv of its own at $GPU_CHECK_VENV
# (default ~/.cache/vllm-sidecar/gpu-check-venv, made with --system-site-packages so that a
# system PyTorch is reused), into which nvidia-ml-py, PyYAML and, when it cannot import one,
# torch (PyPI's CUDA build: several GB; GPU_CHECK_NO_TORCH=1 skips it) are installed.
# Exit: 0 pass, 1 a check failed, 2 no usable NVIDIA GPU, 3 the setup failed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"

say() { echo "gpu-check.sh: $*" >&2; }
imports() { "$1" -c "import $2" >/dev/null 2>&1; }

recording=0
for arg in "$@"; do [[ "$arg" == --record* ]] && recording=1; done

echo "== nvidia-smi =="
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total,utilization.gpu \
    --format=csv || say "nvidia-smi failed: is the driver loaded? (continuing)"
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv || true
else
  say "no nvidia-smi on PATH: no NVIDIA driver here, or the container was not given the GPUs"
  say "(--gpus all / runtime: nvidia); continuing, gpu_check.py will say what NVML says"
fi

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  venv_python="$root/.venv/bin/python"
  if [[ -x "$venv_python" ]] && imports "$venv_python" "pynvml, yaml" \
      && { [[ $recording == 1 ]] || imports "$venv_python" torch; }; then
    python="$venv_python"
  else
    venv="${GPU_CHECK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-sidecar/gpu-check-venv}"
    if [[ ! -x "$venv/bin/python" ]]; then
      say "making a venv at $venv"
      mkdir -p "$(dirname "$venv")"
      python3 -m venv --system-site-packages "$venv" \
        || { say "python3 -m venv failed: install python3-venv (3.11 or newer)"; exit 3; }
    fi
    python="$venv/bin/python"
    pip=("$python" -m pip install --quiet --disable-pip-version-check)
    if ! imports "$python" "pynvml, yaml"; then
      "${pip[@]}" "nvidia-ml-py>=12.535" "pyyaml>=6.0" \
        || { say "pip install nvidia-ml-py pyyaml failed (no network? set PYTHON)"; exit 3; }
    fi
    if [[ $recording == 0 && "${GPU_CHECK_NO_TORCH:-0}" != 1 ]] && ! imports "$python" torch; then
      say "installing torch into $venv (PyPI's CUDA build, several GB)"
      "${pip[@]}" torch || { say "pip install torch failed (no network? set PYTHON)"; exit 3; }
    fi
  fi
fi
"$python" - <<'EOF' || true
import sys
try:
    import torch
except ImportError:
    print(f"python: {sys.executable}, no torch")
else:
    print(f"python: {sys.executable}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuda available: {torch.cuda.is_available()}")
EOF

echo "== gpu_check.py =="
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$python" "$here/gpu_check.py" "$@"
