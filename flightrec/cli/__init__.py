"""The command line (`flightrec ...`): `main` is the click group, `entry` the console script."""

from flightrec.cli import history  # noqa: F401  (registers `record` and `history` on `main`)
from flightrec.cli.commands import entry, main

__all__ = ["entry", "main"]
