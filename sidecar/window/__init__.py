"""One window read and made a snapshot: the pipeline that reads top to bottom with the readers
around it (pipeline), and the snapshot record it builds (snapshot).

Layers: docs/design/layout.md."""
