"""What goes to disk and object storage: snapshot folders and their index (folders), the files
in them (writers, stacks, summary_io), the trend table, stall incidents, uploads.

Layers: docs/design/layout.md."""
