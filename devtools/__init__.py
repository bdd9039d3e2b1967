"""Developer tools: a real, tiny vLLM server for tests, benchmarks and `make demo`.

Nothing here is imported by `sidecar/`. vLLM runs in its own virtual environment
(`devtools.vllm_env`), started as a child process (`devtools.server`) and driven over loopback
HTTP (`devtools.loadgen`), so the sidecar's own environment never needs vLLM or torch.
"""
