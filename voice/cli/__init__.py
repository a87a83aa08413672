"""The `hotline` command: one module per command group (`main` holds the root)."""
