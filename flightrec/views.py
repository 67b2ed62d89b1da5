"""`flightrec.views`, the tables of one job for notebooks: kept where the README first put it
(`flightrec.report.tables` holds them)."""

from flightrec.report import tables as _tables
from flightrec.report.tables import *

__all__ = _tables.__all__
