"""`vllm-sidecar diff`: two sides of snapshots (sides) and the verdict on them (text).

Layers: docs/design/layout.md."""
