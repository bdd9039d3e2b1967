"""Flame graphs: the merged call tree (graph), its SVG (svg), and the files it is drawn from and
written to (files).

Layers: docs/design/layout.md."""
