"""The long-running sidecar: its loop (windows or continuous periods on a schedule), the fleet
of several targets, the parts it is built from, what runs beside it (the hang watch, triggers,
uploads, systemd notification) and how failures are counted.

Layers: docs/design/layout.md."""
