"""Errors a user can act on. The CLI turns these into one line on stderr and exit code 2."""

from __future__ import annotations


class FlightrecError(ValueError):
    """Base class: something about the input or the options is wrong; the message says what to do."""


class NoDumpsError(FlightrecError):
    """The directory holds no file that looks like a flight-recorder dump."""


class UnsafePickleError(FlightrecError):
    """A pickle asked to import or call code; it was refused without running anything."""


class DumpFormatError(FlightrecError):
    """A file could not be read as a flight-recorder dump."""


class MultipleJobsError(FlightrecError):
    """The folder holds the dumps of more than one job (or one job written twice): analyse one at a time."""


class HostMapError(FlightrecError):
    """The rank -> host mapping given by the user could not be read."""


class DumpProblemWarning(UserWarning):
    """A dump read with a problem (cut short, fields unreadable, refused as no dump). `analyze` reports these as
    findings, so its CLI does not print them again on stderr."""


def require_count(name: str, value: object) -> None:
    """An option that counts something (ranks, workers) given as 0 or less: the API's twin of click's
    `IntRange(min=1)` on the command line, where a 0 would otherwise read as "not given"."""
    if value is not None and (not isinstance(value, int) or value < 1):
        raise FlightrecError(f"{name} must be a whole number of at least 1, not {value!r}")
