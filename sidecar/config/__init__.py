"""The one configuration: frozen settings with a unit per field (settings, units, listen,
custom_metrics, targets), their loading (defaults, YAML, environment, flags; load), and where
the packaged configs are (packaged).

Layers: docs/design/layout.md."""
