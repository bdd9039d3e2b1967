# syntax=docker/dockerfile:1
# The vllm-sidecar image: the package and its console script `vllm-sidecar`, py-spy (a wheel
# dependency, so /usr/local/bin/py-spy), and the example config as /etc/vllm-sidecar/sidecar.yaml.
#
#   docker build -t vllm-sidecar:local .
#   docker run --rm --pid=container:<vllm> --cap-add SYS_PTRACE vllm-sidecar:local run --discover ...
#
# It runs as root *inside the container*, with every capability dropped but SYS_PTRACE (see
# docker-compose.yml: cap_drop ALL, cap_add SYS_PTRACE, no-new-privileges, read-only root):
# - Docker gives added capabilities to root only; a non-root USER loses them at exec (Docker sets
#   no ambient capabilities), and a file capability on py-spy is ignored under no-new-privileges.
# - vLLM's official image runs as root too, so the sidecar is not more privileged than its target;
#   root here owns nothing on the host and cannot bypass file permissions (no CAP_DAC_OVERRIDE).
# - With SYS_PTRACE added, Docker's default seccomp profile also allows ptrace and
#   process_vm_readv, which py-spy needs; without it py-spy gets "Permission Denied".
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The source is bind-mounted for the install only, so no copy of it stays in a layer. The core
# install is the daemon, snapshot, report and doctor; [s3] adds uploads (config upload:). The
# analysis commands (diff, trend, aggregate) need [analysis]: `pip install "/src[s3,analysis]"`.
# (rw: setuptools writes build/ and *.egg-info into it; those writes are discarded.)
RUN --mount=type=bind,source=.,target=/src,rw \
    pip install "/src[s3]" \
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
