"""`vllm-sidecar classify` without --explain: every stack of the files with its role, phase,
stage and deciding frame, and the samples per phase; as a table or as one JSON document."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.classify.aggregate import label_stacks
from sidecar.classify.classifier import STEP_PHASES, Classifier
from sidecar.parsers import parse_file
from sidecar.tables import table


@dataclass(frozen=True, slots=True)
class ListedStack:
    """One stack of one file as `classify` lists it."""

    source: str
    thread_id: str | None
    thread_name: str | None
    process: str | None
    role: str
    phase: str
    stage: str | None  # only for the step phases (prefill/decode work)
    weight: int
    frame: str | None  # the frame that decided the phase


@dataclass(frozen=True, slots=True)
class Listing:
    stacks: tuple[ListedStack, ...]
    warnings: tuple[str, ...]
    files: tuple[str, ...] = ()  # the files listed, in the order given

    @property
    def several_files(self) -> bool:
        """Whether the output says which file each stack came from (a file column)."""
        return len(self.files) > 1

    @property
    def totals(self) -> list[tuple[str, int]]:
        """Samples per phase, most first."""
        totals: Counter[str] = Counter()
        for s in self.stacks:
            totals[s.phase] += s.weight
        return totals.most_common()

    def totals_by_file(self) -> dict[str, dict[str, int]]:
        """Samples per phase of each file, most first; files in the order given."""
        by_file: dict[str, Counter[str]] = {f: Counter() for f in self.files}
        for s in self.stacks:
            by_file.setdefault(s.source, Counter())[s.phase] += s.weight
        return {f: dict(c.most_common()) for f, c in by_file.items()}

    def as_json(self) -> dict[str, Any]:
        """Each stack names its file in "source"; with several files, also "file" (the same,
        as the text's column is named) and the totals of each file."""
        fields = ListedStack.__slots__
        stacks = [{f: getattr(s, f) for f in fields} for s in self.stacks]
        out: dict[str, Any] = {"stacks": stacks, "totals": dict(self.totals)}
        if self.several_files:
            for entry in stacks:
                entry["file"] = entry["source"]
            out["totals_by_file"] = self.totals_by_file()
        out["warnings"] = list(self.warnings)
        return out

    def as_text(self) -> str:
        rows = [
            [s.thread_id or "-", s.thread_name or "-", s.role, s.phase, s.stage or "-",
             s.weight, s.frame or "-"]
            for s in self.stacks
        ]  # fmt: skip
        head = ["thread", "name", "role", "phase", "stage", "weight", "frame"]
        if self.several_files:  # which file each row came from
            head = ["file", *head]
            rows = [[s.source, *row] for s, row in zip(self.stacks, rows, strict=True)]
        return table(head, rows) + "\n\n" + table(["phase", "weight"], self.totals)


def list_stacks(classifier: Classifier, files: Iterable[Path]) -> Listing:
    """Every stack of `files`, labelled; each thread of a process takes its process's most
    specific role (label_stacks)."""
    stacks: list[ListedStack] = []
    warnings: list[str] = []
    files = tuple(files)
    for path in files:
        parsed = parse_file(path)
        warnings += [f"{path}: {w}" for w in parsed.warnings]
        for labelled in label_stacks(classifier, parsed.stacks):
            stack, label = labelled.stack, labelled.label
            stacks.append(ListedStack(
                source=str(path), thread_id=stack.thread_id, thread_name=stack.thread_name,
                process=stack.process, role=label.role.value, phase=label.phase.value,
                stage=label.stage.value if label.phase in STEP_PHASES else None,
                weight=stack.weight, frame=label.frame.label() if label.frame else None,
            ))  # fmt: skip
    return Listing(tuple(stacks), tuple(warnings), tuple(str(f) for f in files))
