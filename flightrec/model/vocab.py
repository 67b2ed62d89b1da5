"""The words a report is made of, each defined once: verdicts, roles, finding kinds, actions.

They are `StrEnum`s, so a member is its string ("fault" == Verdict.FAULT) in JSON, in comparisons and in
runbooks; docs/report.schema.json is generated from them (`flightrec.report.json_schema`), so the contract cannot
drift from the code.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    FAULT = "fault"                  # something broke the job, and someone is named to act on
    HEALTHY = "healthy"              # nothing wrong in the dumps
    INCONCLUSIVE = "inconclusive"    # something is wrong or unknowable, and nobody can be named


# The exit code of `flightrec analyze` per verdict; 2 is a usage error, 70 a bug in flightrec.
VERDICT_EXIT_CODES = {Verdict.HEALTHY: 0, Verdict.FAULT: 1, Verdict.INCONCLUSIVE: 3}


class Role(StrEnum):
    ROOT_CAUSE = "root_cause"        # what broke the job
    SYMPTOM = "symptom"              # what followed from it (ranks waiting on the root cause)
    WARNING = "warning"              # worth knowing; no verdict rests on it


class FindingKind(StrEnum):
    """What a finding is about; docs/findings.md describes each and its evidence."""

    MISSING_DUMP = "missing_dump"
    NOT_JOINED = "not_joined"
    MISMATCH = "mismatch"
    P2P_UNMATCHED = "p2p_unmatched"
    STUCK_IN_FLIGHT = "stuck_in_flight"
    DEADLOCK = "deadlock"
    SWITCH = "switch"
    STRAGGLER = "straggler"
    SLOW_LINK = "slow_link"
    WAITING = "waiting"
    MIXED_VERSIONS = "mixed_versions"
    DUMP_PROBLEM = "dump_problem"
    LATER_MISMATCHES = "later_mismatches"
    STATE_MISMATCH = "state_mismatch"
    CLOCK_OFFSET = "clock_offset"
    NO_ENTRIES = "no_entries"
    UNRECORDED_GROUPS = "unrecorded_groups"
    WORLD_SIZE_UNKNOWN = "world_size_unknown"
    GPU_STALLED = "gpu_stalled"
    IN_FLIGHT_AT_DUMP = "in_flight_at_dump"
    BEHIND_AT_DUMP = "behind_at_dump"
    UNREADABLE = "unreadable"
    MIXED_INCIDENTS = "mixed_incidents"


class Action(StrEnum):
    """What to do about a finding (`flightrec.diagnosis.actions`), for a runbook to branch on."""

    DRAIN_HOST = "drain_host"                      # its hardware failed: take it out of the pool, restart
    CHECK_LINK = "check_link"                      # a link (NIC, cable, switch port) between two hosts
    CHECK_SWITCH = "check_switch"                  # every host under a switch is implicated
    INSPECT_PROCESS = "inspect_process"            # a process stopped outside any collective: its stack, its log
    FIX_CODE = "fix_code"                          # ranks ran other code: a bug, nothing to drain
    RECOLLECT_DUMPS = "recollect_dumps"            # dumps that could not be read, or written without entries
    RERUN_WITH_WORLD_SIZE = "rerun_with_world_size"  # no dump says how many ranks the job had
    RERUN_WITH_TRIGGER = "rerun_with_trigger"      # the dumps can't say whether the job hung
    NONE = "none"


class MatchStatus(StrEnum):
    """How a collective stands across its members (`analysis.collectives.classify`), worst first."""

    TYPE_MISMATCH = "type_mismatch"      # members called different collectives at one seq
    DTYPE_MISMATCH = "dtype_mismatch"    # the same collective with another dtype
    SIZE_MISMATCH = "size_mismatch"      # ... or another shape
    NOT_JOINED = "not_joined"            # some members never enqueued it
    STATE_MISMATCH = "state_mismatch"    # finished on some members, not begun on others
    IN_FLIGHT = "in_flight"              # every member enqueued it; not finished on all
    MISSING_DUMPS = "missing_dumps"      # members with no dump: how far they got is unknown
    MATCHED = "matched"                  # every member finished it, alike


# Statuses that are a disagreement between members (a rank did something else), not just waiting.
DISAGREEMENTS = (MatchStatus.TYPE_MISMATCH, MatchStatus.DTYPE_MISMATCH, MatchStatus.SIZE_MISMATCH)


class PairStatus(StrEnum):
    """How a send and its receive stand (`analysis.p2p_pairing`)."""

    MATCHED = "matched"
    IN_FLIGHT = "in_flight"
    UNMATCHED_SEND = "unmatched_send"    # a send no receive was posted for
    UNMATCHED_RECV = "unmatched_recv"    # a receive no send was posted for
    SIZE_MISMATCH = "size_mismatch"      # the two ends' sizes differ
