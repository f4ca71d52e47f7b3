"""The one exception the package's Python half raises for a Setup that breaks the contract."""


class SetupError(ValueError):
    """The script's Setup breaks the contract (docs/python.md): one line, exit 2 on every rank."""
