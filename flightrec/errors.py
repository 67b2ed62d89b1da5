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


class HostMapError(FlightrecError):
    """The rank -> host mapping given by the user could not be read."""
