"""flightrec: find the rank, host or link that broke a distributed PyTorch job from its flight-recorder dumps."""

from .errors import FlightrecError
from .load import LoadOptions, Trace, load

__all__ = ["FlightrecError", "LoadOptions", "Trace", "load"]
__version__ = "0.1.0"
