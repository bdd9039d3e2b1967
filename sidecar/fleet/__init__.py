"""`vllm-sidecar aggregate`: many hosts' and deployments' snapshots, local or in object storage
(source), summed (stats), each deployment against the rest of its group (outliers), reported
(report).

Layers: docs/design/layout.md."""
