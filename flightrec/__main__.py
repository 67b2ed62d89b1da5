"""`python -m flightrec`: the command line, for machines where the `flightrec` script is not on PATH."""

from flightrec.cli import entry

entry()
