"""The jobs behind the ``lowbit`` commands (train, test, transform), the built-in model / data catalog, the
passes a TOML config can name, and checkpoint loading. The CLI is a thin layer over this package."""
