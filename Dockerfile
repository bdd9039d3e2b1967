# The vllm-sidecar image: the package and its console script `vllm-sidecar`, py-spy (a wheel
# dependency, beside it in the venv), and the example config as /etc/vllm-sidecar/sidecar.yaml.
#
#   docker compose build sidecar        # or: DOCKER_BUILDKIT=1 docker build -t vllm-sidecar:local .
#   docker run --rm --pid=container:<vllm> --cap-add SYS_PTRACE vllm-sidecar:local run --discover ...
#
# It needs BuildKit (RUN --mount), but only the features of Docker 20.10's built-in Dockerfile
# frontend: no `# syntax=` line (that pulls a frontend image from a registry). The base is a
# build argument: any Debian bookworm image (the default, or one made with debootstrap and
# `docker import` where no registry is reachable: deploy/docker/docker-compose.cpu.yml).
#
# It runs as root *inside the container*, with every capability dropped but SYS_PTRACE (see
# docker-compose.yml: cap_drop ALL, cap_add SYS_PTRACE, no-new-privileges, read-only root):
# - Docker gives added capabilities to root only; a non-root USER loses them at exec (Docker sets
#   no ambient capabilities), and a file capability on py-spy is ignored under no-new-privileges.
# - vLLM's official image runs as root too, so the sidecar is not more privileged than its target;
#   root here owns nothing on the host and cannot bypass file permissions (no CAP_DAC_OVERRIDE).
# - With SYS_PTRACE added, Docker's default seccomp profile also allows ptrace and
#   process_vm_readv, which py-spy needs; without it py-spy gets "Permission Denied".
ARG BASE_IMAGE=debian:bookworm-slim

# --- the wheel, built from the package (`python -m build --wheel`) -------------------------------
FROM ${BASE_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/build
# The optional build secret `pip_ca`: a CA bundle pip must trust to reach the package index
# (a TLS-inspecting proxy); without it pip uses the image's own CA certificates.
# (rw: setuptools writes build/ and *.egg-info into the source; those writes are discarded.)
RUN --mount=type=secret,id=pip_ca --mount=type=bind,source=.,target=/src,rw \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && /opt/build/bin/pip install build==1.6.1 \
    && /opt/build/bin/python -m build --wheel --outdir /dist /src

# --- the image: a venv with the wheel installed, nothing of the source ---------------------------
FROM ${BASE_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/vllm-sidecar/bin:$PATH
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/vllm-sidecar
# The core install is the daemon, snapshot, report and doctor; [s3] adds uploads (config upload:).
# The analysis commands (diff, trend, aggregate) need [analysis]: "$wheel[s3,analysis]".
RUN --mount=type=secret,id=pip_ca --mount=type=bind,from=wheel,source=/dist,target=/dist \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && pip install "$(ls /dist/vllm_sidecar-*.whl)[s3]" \
    && vllm-sidecar --version \
    && py-spy --version

# The example config as the default; the phase and advice rules are package data (sidecar/configs/).
COPY sidecar/configs/sidecar.yaml /etc/vllm-sidecar/sidecar.yaml

# Snapshots go to a volume here; the exporter serves Prometheus on 19464.
VOLUME ["/var/lib/vllm-sidecar"]
EXPOSE 19464

# The exporter's /metrics answers once the sidecar has started. This check reaches it on
# 127.0.0.1:19464, i.e. when it listens on 127.0.0.1 (the default) or 0.0.0.0 (docker-compose.yml);
# HEALTHCHECK_URL overrides it when the exporter listens elsewhere. (Not VLLM_SIDECAR_*: that
# prefix is the sidecar's own configuration namespace.)
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('HEALTHCHECK_URL', 'http://127.0.0.1:19464/metrics'), timeout=4)"]

ENTRYPOINT ["vllm-sidecar"]
CMD ["run", "--config", "/etc/vllm-sidecar/sidecar.yaml"]
