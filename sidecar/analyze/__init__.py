"""Figures computed from snapshot summaries: the statistics of one side against another
(compare), the prefill/decode computation split, the memory breakdown.

Layers: docs/design/layout.md."""
