"""`vllm-sidecar trend`: the trend table read over days (source), its series and change points,
and a plot.

Layers: docs/design/layout.md."""
