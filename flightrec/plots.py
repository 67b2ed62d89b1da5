"""`flightrec.plots`, the figures for notebooks: kept where the README first put it (`flightrec.report.plots`
holds them)."""

from flightrec.report import plots as _figures
from flightrec.report.plots import *

__all__ = _figures.__all__
