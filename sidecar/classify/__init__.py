"""Stacks to serving phases (docs/PHASES.md): the rules as data (configs/phases.yaml), the role
tables, the classifier, the aggregation of a window, the ground-truth check against /proc CPU
time, and `classify --explain` / `rules suggest`. Pure: no file or process is read here except
the rules file by its loader.

Layers: docs/design/layout.md."""
