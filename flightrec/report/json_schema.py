"""The JSON Schema of `flightrec analyze --format json`, generated from the code's own vocabulary.

docs/report.schema.json is this module's output (`python -m flightrec.report.json_schema > docs/report.schema.json`);
a test checks the file is current. Fields may be added, never renamed; a change that breaks a reader bumps
REPORT_VERSION.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from flightrec.model.schema import REPORT_VERSION
from flightrec.model.vocab import Action, FindingKind, Role, Verdict

_RANKS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_LINKS = {"type": "array", "items": {"$ref": "#/$defs/link"}}


def _culprits() -> dict[str, Any]:
    return {
        "description": "Every root cause's ranks, hosts, links and switches; then the same by what to do about "
                       "them, for a runbook: drain `hosts_to_drain`, test `links_to_check`, look at the "
                       "processes of `ranks_to_inspect`; `ranks_with_other_code` ran other code (a bug: no host "
                       "to drain).",
        "type": "object",
        "required": ["ranks", "hosts", "links", "switches", "hosts_to_drain", "links_to_check", "ranks_to_inspect",
                     "ranks_with_other_code"],
        "properties": {
            "ranks": _RANKS, "hosts": _STRINGS, "links": _LINKS, "switches": _STRINGS,
            "hosts_to_drain": _STRINGS, "links_to_check": _LINKS, "ranks_to_inspect": _RANKS,
            "ranks_with_other_code": _RANKS,
        },
    }


def _dumps() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["world_size", "loaded", "missing_ranks", "versions", "refused", "unreadable", "host_source",
                     "only_active", "writers", "empty_host_folders", "fast_reader_declined", "folder", "last_entry_at",
                     "last_entry_ns"],
        "properties": {
            "world_size": {"type": "integer", "minimum": 0},
            "loaded": {"type": "integer", "minimum": 0},
            "missing_ranks": _RANKS,
            "versions": _STRINGS,
            "refused": {"description": "Files read and refused as no dump, with why.",
                        "type": "array", "items": {"type": "object", "required": ["path", "reason"]}},
            "unreadable": {"description": "Files there that could not be read (permissions, an I/O error), and "
                                          "folders that could not be listed (rank null).",
                           "type": "array", "items": {"type": "object", "required": ["path", "reason", "rank"]}},
            "host_source": {"description": "Where host names came from (a hosts file, folder names, "
                                           "--ranks-per-host, 'one host folder', 'none').", "type": "string"},
            "only_active": {"description": "The dumps hold only unfinished entries (TORCH_INCLUDE_ONLY_ACTIVE).",
                            "type": "boolean"},
            "writers": {"description": "Who wrote the dumps loaded, and how many: pytorch, c10d_hook, torchcomms.",
                        "type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
            "empty_host_folders": {"description": "Folders beside the host folders holding dumps, named alike "
                                                  "(node1 beside node0), that hold none: hosts gone.",
                                   "type": "array", "items": {"type": "string"}},
            "fast_reader_declined": {"description": "Files the fast reader left to the unpickler, with why.",
                                     "type": "array", "items": {"type": "object", "required": ["path", "reason"]}},
            "folder": {"description": "The dump folder's name.", "type": "string"},
            "last_entry_at": {"description": "When the job's newest entry was enqueued (ISO 8601, UTC), if the "
                                             "dumps hold times: with `folder`, what tells incidents apart.",
                              "type": ["string", "null"]},
            "last_entry_ns": {"description": "The same in nanoseconds since the epoch: the same dumps, wherever "
                                             "they are copied, give the same value (the incident log's key).",
                              "type": ["integer", "null"]},
            "window": {"description": "Only from an analysis of shards with a window (`flightrec analyze SHARDS "
                                      "--window N`, or on a cluster): each rank's newest `entries_per_rank` entries "
                                      "were analysed, as if the recorder kept that many; `entries_left_out` older "
                                      "ones were not; `ranks_kept_whole` ranks' dumps (of unfinished entries only, "
                                      "or Gloo's) were kept whole; read from `shards`.",
                       "type": "object",
                       "required": ["entries_per_rank", "entries_left_out", "ranks_kept_whole", "shards"],
                       "properties": {k: {"type": "integer", "minimum": 0} for k in
                                      ("entries_per_rank", "entries_left_out", "ranks_kept_whole", "shards")}},
        },
    }


def _finding() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["kind", "role", "ranks", "hosts", "links", "process_group", "collective_seq_id", "p2p_seq_id",
                     "op", "message", "action", "next_step", "evidence"],
        "properties": {
            "kind": {"description": "docs/findings.md describes each kind and its evidence.",
                     "enum": [k.value for k in FindingKind]},
            "role": {"enum": [r.value for r in Role]},
            "ranks": _RANKS,
            "hosts": _STRINGS,
            "links": _LINKS,
            "process_group": {"oneOf": [
                {"type": "null"},
                {"type": "object", "required": ["name", "desc", "size"],
                 "properties": {"name": {"type": "string"}, "desc": {"type": "string"}, "size": {"type": "integer"}}},
            ]},
            "collective_seq_id": {"type": ["integer", "null"]},
            "p2p_seq_id": {"type": ["integer", "null"]},
            "op": {"type": ["string", "null"]},
            "message": {"type": "string", "minLength": 1},
            "action": {"description": "What to do about it (docs/runbook.md).", "enum": [a.value for a in Action]},
            "next_step": {"description": "The action in one line for a person; empty when there is nothing to do.",
                          "type": "string"},
            "evidence": {"type": "object"},
        },
    }


def report_schema() -> dict[str, Any]:
    """The schema as a dict."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://flightrec.dev/report.schema.json",
        "title": "flightrec analyze --format json",
        "description": f"Report version {REPORT_VERSION}. Fields may be added, never renamed. Generated by "
                       "`python -m flightrec.report.json_schema`.",
        "type": "object",
        "required": ["report_version", "verdict", "summary", "next_step", "culprits", "findings", "dumps"],
        "properties": {
            "report_version": {"const": REPORT_VERSION},
            "verdict": {"description": "fault: exit 1; healthy: exit 0; inconclusive: exit 3.",
                        "enum": [v.value for v in Verdict]},
            "summary": {"type": "string", "minLength": 1},
            "next_step": {"description": "What to do first, one line; empty when healthy.", "type": "string"},
            "culprits": _culprits(),
            "findings": {"type": "array", "items": {"$ref": "#/$defs/finding"}},
            "dumps": _dumps(),
            "scope": {
                "description": "Only with --pg (pg=): the selector, how many groups it selected, and the job's groups.",
                "type": "object",
                "required": ["pg", "groups", "of_groups"],
                "properties": {"pg": {"type": "string"}, "groups": {"type": "integer", "minimum": 0},
                               "of_groups": {"type": "integer", "minimum": 0}},
            },
        },
        "$defs": {
            "link": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
            "finding": _finding(),
        },
    }


def render() -> str:
    """The schema as docs/report.schema.json holds it."""
    return json.dumps(report_schema(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
