"""The vLLM deployment seen from outside: /proc (procfs), its processes and roles (discovery),
PID namespaces (pidmap), its flags, model config, KV cache, installed software and
fingerprint, and its resource use.

Layers: docs/design/layout.md."""
