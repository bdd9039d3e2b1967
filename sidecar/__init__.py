"""vllm-sidecar: a profiling sidecar for vLLM servers."""

__version__ = "0.1.0"
