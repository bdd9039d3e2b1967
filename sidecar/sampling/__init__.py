"""py-spy, attached to the target's processes: the runner (pyspy), one window of segments
(sampler) and continuous mode's rates per role within a CPU budget (continuous).

Layers: docs/design/layout.md."""
