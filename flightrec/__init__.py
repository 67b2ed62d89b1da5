"""flightrec: find the rank, host or link that broke a distributed PyTorch job from its flight-recorder dumps."""

from flightrec.api import AnalyzeOptions, analyze
from flightrec.errors import FlightrecError
from flightrec.ingest.load import load
from flightrec.model.trace import LoadOptions, Trace
from flightrec.report.model import Finding, Report

__all__ = ["AnalyzeOptions", "Finding", "FlightrecError", "LoadOptions", "Report", "Trace", "analyze", "load"]
__version__ = "0.1.0"
