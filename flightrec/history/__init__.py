"""Across incidents: an incident log of every report recorded (`History`), the hosts, links, switches and ranks
named again and again (`offenders`), and a backfill of old incident folders (`backfill`)."""

from flightrec.history.backfill import Backfill, backfill
from flightrec.history.offenders import hosts_by_week, incidents, named, offenders
from flightrec.history.store import History, HistoryError, Recorded, default_path

__all__ = ["Backfill", "History", "HistoryError", "Recorded", "backfill", "default_path", "hosts_by_week",
           "incidents", "named", "offenders"]
