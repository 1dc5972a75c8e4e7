"""The command-line layer: one module per command, each a thin face over the library."""
