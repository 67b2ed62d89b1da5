"""flightrec: find the rank, host or link that broke a distributed PyTorch job from its flight-recorder dumps.

The public names are imported when first used (`flightrec.analyze` loads the engine, Polars and Arrow: ~0.6 s),
so `flightrec --help` and a script that only needs one part start without the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_WHERE = {
    "AnalyzeOptions": "flightrec.api", "analyze": "flightrec.api",
    "FlightrecError": "flightrec.errors",
    "load": "flightrec.ingest.load",
    "LoadOptions": "flightrec.model.trace", "Trace": "flightrec.model.trace",
    "Finding": "flightrec.report.model", "Report": "flightrec.report.model",
}
__all__ = ["AnalyzeOptions", "Finding", "FlightrecError", "LoadOptions", "Report", "Trace", "analyze", "load"]

if TYPE_CHECKING:
    from flightrec.api import AnalyzeOptions, analyze
    from flightrec.errors import FlightrecError
    from flightrec.ingest.load import load
    from flightrec.model.trace import LoadOptions, Trace
    from flightrec.report.model import Finding, Report


def __getattr__(name: str):
    if name not in _WHERE:   # (an AttributeError lets `from flightrec import plots` import the submodule)
        raise AttributeError(f"module 'flightrec' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
