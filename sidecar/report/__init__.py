"""`vllm-sidecar report`: one snapshot as text and JSON (text, threads) and as one HTML page
(page, page_assets, page_inputs).

Layers: docs/design/layout.md."""
