"""The built-in configs, shipped as package data and read through importlib.resources (so they
are found however the package is installed: a venv, `pip install --user`, `--target`, a wheel
in an image): phases.yaml (the phase rules), advice.yaml (the advice rules) and sidecar.yaml
(the example config, `vllm-sidecar config example` prints it). The checkout's `configs/` holds
links to these files, so the paths the documentation names keep working."""
