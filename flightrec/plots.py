"""`flightrec.plots`, the figures for notebooks: kept where the README first put it (`flightrec.report.plots`
holds them)."""

from flightrec.report.plots import *
from flightrec.report.plots import __all__
