"""`vllm-sidecar report`: one snapshot as views built once from its summary (views, build), read
by the text and JSON (text, threads) and by one HTML page (page, page_assets, page_inputs).

Layers: docs/design/layout.md."""
