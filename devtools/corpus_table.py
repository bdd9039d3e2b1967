"""Writes tests/fixtures/public/corpus/README.md from the corpus manifests (labels-*.yaml): one
row per dump with its source, vLLM, runtime, executor, format and labels. Run it after adding
dumps: `python -m devtools.corpus_table`; tests/unit/classify/test_public_corpus.py checks that
every dump has its row."""

from __future__ import annotations

from pathlib import Path

import yaml

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "public" / "corpus"

HEAD = """\
# Public corpus: real vLLM dumps this project's rules were not built on

Every file is one dump of a vLLM process (or of a process hosting vLLM) as its reporter posted it
in a public issue, pull request or note: py-spy and faulthandler dumps, tracebacks and chains of
them, pystack and perf output, with the log prefixes, colours, elisions and cuts of the paste kept.
The excerpts were copied from the public threads as the search tools returned them; where one
was cut, the file is cut at the same place, and where a few lines were left out or could only be
retyped (progress bars, caret rows), the manifest's `note` says so. The labels follow
`docs/PHASES.md` and say in `why` which rule decided them; where the excerpt itself does not tell
the role (no title, tag or marker frame), the label says `role: null` and only the phase is
scored. `tests/unit/classify/test_public_corpus.py` prints the classifier's accuracy per runtime
and executor and holds it to 95 % overall, no runtime under 90 %.

This file is written by `python -m devtools.corpus_table` from the manifests `labels-*.yaml`.

| file | source | vLLM | runtime | executor | format | labels (role/phase/stage) |
|---|---|---|---|---|---|---|
"""


def label_text(label: dict) -> str:
    key = f"t{label['thread']}" if "thread" in label else f"#{label['nth']}"
    stage = f"/{label['stage']}" if label.get("stage") else ""
    return f"{key}: {label.get('role') or '?'}/{label['phase']}{stage}"


def cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def rows() -> list[str]:
    out = []
    for path in sorted(CORPUS.glob("labels-*.yaml")):
        for e in yaml.safe_load(path.read_text()) or []:
            labels = "; ".join(label_text(x) for x in e.get("labels") or []) or "(none)"
            fields = (e["file"], e["source"], e.get("vllm", "?"), e["runtime"], e["executor"],
                      e.get("format", "?"), labels)  # fmt: skip
            out.append("| " + " | ".join(cell(f) for f in fields) + " |")
    return out


def main() -> None:
    text = HEAD + "\n".join(rows()) + "\n"
    (CORPUS / "README.md").write_text(text)
    print(f"wrote {CORPUS / 'README.md'} ({len(rows())} dumps)")


if __name__ == "__main__":
    main()
