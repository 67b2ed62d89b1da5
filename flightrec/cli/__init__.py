"""The command line (`flightrec ...`): `main` is the click group, `entry` the console script."""

from flightrec.cli import history, shards  # noqa: F401  (register `record`, `history`, `convert`, `convert-hosts`)
from flightrec.cli.commands import entry, main

__all__ = ["entry", "main"]
