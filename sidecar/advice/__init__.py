"""Findings: what a snapshot's figures say to change, from rules held as data
(configs/advice.yaml): the rules and their small expression language, the figures they read,
the findings they give.

Layers: docs/design/layout.md."""
