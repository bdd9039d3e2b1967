"""sidecar/config/entries.py: one check for a list entry of the config file, so `targets:` and
`custom_metrics:` word the same mistake alike."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from sidecar.config.custom_metrics import parse_custom_metrics
from sidecar.config.entries import mapping_entry
from sidecar.config.targets import parse_targets
from sidecar.errors import ConfigError

KEYS = ("name", "metric")


def test_a_mapping_of_known_keys_passes_as_it_is() -> None:
    entry = {"name": "a"}
    assert mapping_entry(entry, "x[0]", "f.yaml", KEYS, "e.g. - {name: a}") is entry


def test_every_unknown_key_is_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        mapping_entry({"name": "a", "zz": 1, "bad": 2}, "x[3]", "f.yaml", KEYS, "e.g.")
    assert str(err.value) == "x[3]: unknown keys ['bad', 'zz'] (f.yaml); known: name, metric"


def test_no_mapping_is_answered_with_the_example() -> None:
    with pytest.raises(ConfigError) as err:
        mapping_entry(["a"], "x[0]", "f.yaml", KEYS, "e.g. - {name: a}")
    assert str(err.value) == "x[0]: is a list (f.yaml); give a mapping, e.g. - {name: a}"


@pytest.mark.parametrize(
    ("parse", "entry"),
    [(parse_targets, {"pid": 1, "pod": 2}),
     (parse_custom_metrics, {"name": "a", "metric": "m", "pod": 2})],
)  # fmt: skip
def test_both_lists_word_an_unknown_key_alike(
    parse: Callable[[Any, str], object], entry: dict[str, object]
) -> None:
    with pytest.raises(ConfigError) as err:
        parse([entry], "f.yaml")
    assert re.fullmatch(r"\w+\[0\]: unknown keys \['pod'\] \(f\.yaml\); known: [\w, ]+",
                        str(err.value))  # fmt: skip
