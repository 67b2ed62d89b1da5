"""`flightrec.views`, the tables of one job for notebooks: kept where the README first put it
(`flightrec.report.tables` holds them)."""

from flightrec.report.tables import *
from flightrec.report.tables import __all__
