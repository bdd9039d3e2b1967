"""YAML that expands past any real config is refused, fast (issue 26, item 17): 384 bytes of
aliases to aliases took 10 s and 677 MB when an error message formatted the value."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from sidecar.advice.rules import parse_advice
from sidecar.classify.rules import parse_rules
from sidecar.config.load import _read_yaml
from sidecar.config.packaged import MAX_YAML_VALUES, expanded_size, load_yaml
from sidecar.errors import ConfigError

LEVELS = "abcdefg"
BOMB = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in itertools.pairwise(LEVELS)
)


def test_the_bomb_is_small_and_expands_past_the_bound() -> None:
    assert len(BOMB) < 400
    with pytest.raises(ConfigError, match="expands to over"):
        load_yaml(BOMB, "bomb.yaml")


@pytest.mark.parametrize("reader", [parse_rules, parse_advice])
def test_rules_and_advice_files_refuse_it(reader: object) -> None:
    started = time.process_time()
    with pytest.raises(ConfigError, match="expands to over"):
        reader("rules: []\n" + BOMB, "bomb.yaml")  # type: ignore[operator]
    assert time.process_time() - started < 2.0  # a bound far above the milliseconds it takes


def test_the_config_file_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(BOMB)
    with pytest.raises(ConfigError, match="expands to over"):
        _read_yaml(path)


def test_sizes_count_repeats_once_per_use() -> None:
    shared = [1, 2, 3]
    assert expanded_size({"x": shared, "y": shared}) == 1 + 2 + 2 * 4
    assert expanded_size([[0] * 10] * 10) == 1 + 10 * 11
    assert expanded_size(list(range(MAX_YAML_VALUES + 5))) == MAX_YAML_VALUES + 1


def test_a_value_that_contains_itself_is_refused() -> None:
    # `&a [1, *a]` makes a list that holds itself; counting its values never ended.
    with pytest.raises(ConfigError, match="contains itself"):
        load_yaml("a: &a [1, *a]\n", "loop.yaml")
