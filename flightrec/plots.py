"""`flightrec.plots`, the figures for notebooks: kept where the README first put it (`flightrec.report.plots`
holds one job's figures, `flightrec.history.plots` the fleet's history)."""

from flightrec.history.plots import hosts_heat_map, incidents_over_time
from flightrec.report import plots as _figures
from flightrec.report.plots import *

__all__ = ["hosts_heat_map", "incidents_over_time", *_figures.__all__]   # noqa: PLE0604 (its names are strings)
