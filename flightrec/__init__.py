"""flightrec: find the rank, host or link that broke a distributed PyTorch job from its flight-recorder dumps."""

from .api import AnalyzeOptions, analyze
from .errors import FlightrecError
from .load import LoadOptions, Trace, load
from .report import Finding, Report

__all__ = ["AnalyzeOptions", "Finding", "FlightrecError", "LoadOptions", "Report", "Trace", "analyze", "load"]
__version__ = "0.1.0"
