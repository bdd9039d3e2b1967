"""`vllm-sidecar export tensorboard`: snapshots as TensorBoard scalars (scalars), written as
event files (event_files).

Layers: docs/design/layout.md."""
