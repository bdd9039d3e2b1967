"""The light install (issue 23, item 1): the built-in configs are package data, the optional
libraries are extras that a command names when it needs one, and `doctor` sees the other
package that installs the import name `sidecar`. (The wheel itself, installed into a fresh
venv and with --target: tests/integration/test_wheel_install.py.)"""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import sidecar
from sidecar.cli import cli, main
from sidecar.config.packaged import packaged_config
from sidecar.doctor import Status, extras_check, install_check
from sidecar.extras import EXTRAS, MissingExtra, extra_of, missing_extra
from sidecar.report.page import Missing
from sidecar.report.page_inputs import _needing_extra

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(sidecar.__file__).parent


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def requirement_names(text: str) -> list[str]:
    lines = [ln.strip() for ln in text.splitlines()]
    return [ln.split(">")[0].split("=")[0].split("[")[0].strip() for ln in lines if ln]


@pytest.mark.parametrize("name", ["phases.yaml", "advice.yaml", "sidecar.yaml"])
def test_built_in_configs_are_package_data(name: str) -> None:
    """Found inside the package (importlib.resources), not in the checkout's configs/ nor a
    share/ prefix, which `pip install --user` and `--target` do not have."""
    path = packaged_config(name)
    assert path.is_file() and path.parent == PACKAGE / "configs"
    assert (ROOT / "configs" / name).resolve() == path.resolve()  # the checkout's link
    patterns = setup_cfg()["options.package_data"]["sidecar.configs"]
    assert "*.yaml" in patterns


def test_the_core_install_leaves_the_analysis_libraries_to_extras() -> None:
    cfg = setup_cfg()
    core = requirement_names(cfg["options"]["install_requires"])
    extras = cfg["options.extras_require"]
    for heavy in ("scipy", "matplotlib", "duckdb", "tensorboardX", "s3fs", "fsspec"):
        assert heavy not in core
    for extra in EXTRAS:  # the table the messages come from lists what setup.cfg installs
        assert requirement_names(extras[extra.name]) == list(extra.distributions)
    assert "vllm-sidecar[analysis,tensorboard,s3]" in extras["dev"]


@pytest.mark.parametrize(
    ("module", "extra"),
    [("scipy", "analysis"), ("scipy.stats", "analysis"), ("matplotlib.pyplot", "analysis"),
     ("duckdb", "analysis"), ("tensorboardX", "tensorboard"), ("s3fs", "s3"), ("pandas", None),
     ("no_such_module", None)],
)  # fmt: skip
def test_extra_of(module: str, extra: str | None) -> None:
    found = extra_of(module)
    assert (found.name if found else None) == extra


def test_missing_extra_names_the_pip_install() -> None:
    error = missing_extra(ModuleNotFoundError("No module named 'scipy'", name="scipy"), "diff")
    assert isinstance(error, MissingExtra) and error.exit_code == 2
    assert "vllm-sidecar diff needs scipy" in str(error)
    assert "pip install 'vllm-sidecar[analysis]'" in str(error)
    assert missing_extra(ModuleNotFoundError("x", name="yaml")) is None


def test_a_command_without_its_extra_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a ModuleNotFoundError traceback and 'internal error' (exit 70)."""
    fixtures = ROOT / "tests/fixtures/flame"
    for module in ("sidecar.analyze.compare", "sidecar.analyze.intervals"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy: ModuleNotFoundError
    code = main(["diff", str(fixtures / "prefill-heavy"), str(fixtures / "decode-heavy")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "vllm-sidecar diff needs scipy" in err and "[analysis]" in err
    assert "Traceback" not in err


def test_a_missing_module_of_no_extra_stays_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in ("sidecar.analyze.compare", "sidecar.analyze.intervals"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setattr("sidecar.extras.EXTRAS", ())
    fixtures = ROOT / "tests/fixtures/flame"
    code = main(["diff", str(fixtures / "prefill-heavy"), str(fixtures / "decode-heavy")])
    assert code == 70
    assert "Traceback" in capsys.readouterr().err


def test_the_page_leaves_out_what_an_extra_would_add() -> None:
    def plot() -> bytes:
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    missing = _needing_extra("trend plot", plot)
    assert isinstance(missing, Missing)
    assert "pip install 'vllm-sidecar[analysis]'" in missing.why


def test_doctor_sees_the_jupyterlab_sidecar_package() -> None:
    """The PyPI package `sidecar` (a JupyterLab widget) installs the same import name."""
    clash = install_check({"sidecar": ["vllm-sidecar", "sidecar"], "yaml": ["PyYAML"]})
    assert clash.status is Status.FAIL
    assert "sidecar is installed here too" in clash.detail and "JupyterLab" in clash.detail
    assert "pip uninstall sidecar" in clash.fix and "venv" in clash.fix
    alone = install_check({"sidecar": ["vllm-sidecar"]})
    assert alone.status is Status.OK


def test_doctor_lists_the_extras() -> None:
    none_missing = extras_check(lambda extra: ())
    assert none_missing.status is Status.OK
    assert none_missing.detail == "installed: analysis, tensorboard, s3"
    no_tb = extras_check(lambda extra: ("tensorboardX",) if extra.name == "tensorboard" else ())
    assert no_tb.status is Status.OK  # the daemon needs none of them
    assert "not installed: [tensorboard] for export tensorboard" in no_tb.detail
    assert "pip install 'vllm-sidecar[tensorboard]'" in no_tb.fix


def test_config_example_prints_and_writes_the_shipped_file(tmp_path: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(cli, ["config", "example"])
    assert shown.exit_code == 0
    assert shown.output == (PACKAGE / "configs" / "sidecar.yaml").read_text()
    dest = tmp_path / "sidecar.yaml"
    assert runner.invoke(cli, ["config", "example", "-o", str(dest)]).exit_code == 0
    assert dest.read_text() == shown.output
    assert main(["config", "example", "-o", str(dest)]) == 6  # refused: never overwritten
    assert dest.read_text() == shown.output
    rules = runner.invoke(cli, ["config", "example", "--which", "phases"])
    assert rules.output.startswith("# Phase rules")


def test_the_readmes_install_sizes_are_the_recorded_ones() -> None:
    """README.md's table against `make install-sizes`'s record (fresh venvs, byte-compiled)."""
    import json
    import re

    sizes = json.loads((ROOT / "tests/fixtures/install/sizes.json").read_text())["sizes"]
    readme = (ROOT / "README.md").read_text()
    core = re.search(r"^\| `vllm-sidecar` \|.*\| (\d+) MB \|$", readme, re.M)
    assert core and int(core.group(1)) == round(sizes["core"]["mb"])
    for extra in EXTRAS:
        row = re.search(rf"^\| `vllm-sidecar\[{extra.name}\]` \|.*\| \+ (\d+) MB", readme, re.M)
        assert row, f"no README row for [{extra.name}]"
        assert int(row.group(1)) == round(sizes[f"[{extra.name}]"]["added_mb"])
    assert sizes["core"]["mb"] < 687 / 1.5  # the all-in-one install took 687 MB
