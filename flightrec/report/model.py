"""The report: findings ordered root causes first, as versioned JSON, text, markdown and HTML.

The JSON shape is a contract (docs/report.schema.json): fields may be added, never renamed.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from flightrec.model.schema import REPORT_VERSION
from flightrec.model.topology import NO_HOSTS_HINT
from flightrec.model.trace import format_ranks
from flightrec.model.vocab import VERDICT_EXIT_CODES, Action, FindingKind, Role, Verdict
from flightrec.model.wording import listed


@dataclass(frozen=True)
class ProcessGroupRef:
    name: str
    desc: str
    size: int

    def label(self) -> str:
        desc = f" (desc '{self.desc}')" if self.desc and self.desc != "undefined" else ""
        return f"group {self.name}{desc}"


@dataclass(frozen=True)
class Finding:
    """One thing flightrec found. `evidence` is free-form, documented per kind in docs/findings.md."""

    kind: str
    role: str
    message: str
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    links: list[list[str]] = field(default_factory=list)
    process_group: ProcessGroupRef | None = None
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    op: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    stacks: list[dict] = field(default_factory=list)   # frames of the culprits' last entries (text report)
    action: str | None = None     # what to do (`actions.Action`): drain_host, check_link, fix_code, ...
    next_step: str = ""           # the same, one line for a person

    def __post_init__(self) -> None:
        # (a kind or role outside the vocabulary would break the JSON contract: fail where it is made)
        FindingKind(self.kind)
        Role(self.role)
        if self.action is not None:
            Action(self.action)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "role": self.role,
            "ranks": sorted(self.ranks),
            "hosts": sorted(self.hosts),
            "links": sorted(sorted(link) for link in self.links),
            "process_group": None if self.process_group is None else {
                "name": self.process_group.name, "desc": self.process_group.desc, "size": self.process_group.size},
            "collective_seq_id": self.collective_seq_id,
            "p2p_seq_id": self.p2p_seq_id,
            "op": self.op,
            "message": self.message,
            "action": self.action or "none",
            "next_step": self.next_step,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class DumpSummary:
    world_size: int
    loaded: int
    missing_ranks: list[int]
    versions: list[str]
    refused: list[dict[str, str]] = field(default_factory=list)
    # files there that could not be read (permissions, an I/O error), and folders that could not be listed:
    # [{"path", "reason", "rank" (None for a folder)}]
    unreadable: list[dict] = field(default_factory=list)
    host_source: str = "none"
    # the job's writer kept only unfinished entries (TORCH_INCLUDE_ONLY_ACTIVE): nothing finished to compare or time
    only_active: bool = False
    # who wrote the dumps loaded: {"pytorch": 14, "torchcomms": 2} (`writers`)
    writers: dict[str, int] = field(default_factory=dict)
    # host folders beside those holding dumps, named alike, that hold none (`discover.Found.empty_hosts`)
    empty_host_folders: list[str] = field(default_factory=list)
    # files the fast reader left to the unpickler, with why: [{"path", "reason"}]
    fast_reader_declined: list[dict[str, str]] = field(default_factory=list)
    # the dump folder's name, and when the job's newest entry was enqueued (ISO 8601, UTC; None without times):
    # what tells one incident from another in the history (`flightrec.history`)
    folder: str = ""
    last_entry_at: str | None = None
    last_entry_ns: int | None = None   # the same, to the nanosecond: one incident's dumps wherever they are copied
    # Only from `flightrec.distributed`: each rank's newest `entries_per_rank` entries were analysed, as if the
    # recorder's buffer held that many (`entries_left_out` older ones were not; `ranks_kept_whole` ranks' dumps,
    # of unfinished entries only or Gloo's, were kept whole), read from `shards` shards
    window: dict[str, int] | None = None


@dataclass(frozen=True)
class Report:
    """What `flightrec.analyze` returns. `trace` and `matching` give the frames behind it (for notebooks)."""

    verdict: str
    summary: str
    findings: list[Finding]
    dumps: DumpSummary
    trace: Any = field(default=None, repr=False, compare=False)
    matching: Any = field(default=None, repr=False, compare=False)
    waits: Any = field(default=None, repr=False, compare=False)
    topology: Any = field(default=None, repr=False, compare=False)
    timing: Any = field(default=None, repr=False, compare=False)
    # {"pg", "groups", "of_groups"}: the analysis was restricted to the groups `--pg` selects; None: every group
    scope: dict[str, Any] | None = None

    @property
    def collectives(self):
        """One row per (group, seq) with its match status (`matching.collectives`)."""
        return self.matching.collectives

    @property
    def progress(self):
        """One row per (group, member): how far it got (`matching.progress`)."""
        return self.matching.progress

    @property
    def root_causes(self) -> list[Finding]:
        return [f for f in self.findings if f.role == "root_cause"]

    @property
    def culprits(self) -> dict[str, list]:
        """Every root cause's ranks, hosts, links and switches; and by what to do about them: the hosts whose
        hardware failed (drain them), the links to test, the ranks whose process to look at, the ranks that ran
        other code (a bug: no host to drain)."""
        roots = self.root_causes

        def of(*actions: str) -> list[Finding]:
            return [f for f in roots if f.action in actions]

        return {
            "ranks": sorted({r for f in roots for r in f.ranks}),
            "hosts": sorted({h for f in roots for h in f.hosts}),
            "links": sorted({tuple(sorted(link)) for f in roots for link in f.links}),
            "switches": sorted({f.evidence["switch"] for f in roots if f.kind == "switch"}),
            "hosts_to_drain": sorted({h for f in of("drain_host") for h in f.hosts}),
            "links_to_check": sorted({tuple(sorted(link)) for f in of("check_link") for link in f.links}),
            "ranks_to_inspect": sorted({r for f in of("inspect_process") for r in f.ranks}),
            "ranks_with_other_code": sorted({r for f in of("fix_code") for r in f.ranks}),
        }

    @property
    def next_step(self) -> str:
        """What to do first, one line: the first root cause's next step, else the first finding's that has one."""
        for f in [*self.root_causes, *self.findings]:
            if f.next_step:
                return f.next_step
        return ""

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT_CODES[Verdict(self.verdict)]

    def to_dict(self) -> dict[str, Any]:
        c = self.culprits
        return {
            "report_version": REPORT_VERSION,
            "verdict": self.verdict,
            "summary": self.summary,
            "next_step": self.next_step,
            "culprits": {**c, "links": [list(x) for x in c["links"]],
                         "links_to_check": [list(x) for x in c["links_to_check"]]},
            "findings": [f.to_dict() for f in self.findings],
            "dumps": {
                "world_size": self.dumps.world_size,
                "loaded": self.dumps.loaded,
                "missing_ranks": self.dumps.missing_ranks,
                "versions": self.dumps.versions,
                "refused": self.dumps.refused,
                "unreadable": self.dumps.unreadable,
                "host_source": self.dumps.host_source,
                "only_active": self.dumps.only_active,
                "writers": self.dumps.writers,
                "empty_host_folders": self.dumps.empty_host_folders,
                "fast_reader_declined": self.dumps.fast_reader_declined,
                "folder": self.dumps.folder,
                "last_entry_at": self.dumps.last_entry_at,
                "last_entry_ns": self.dumps.last_entry_ns,
                **({"window": self.dumps.window} if self.dumps.window else {}),
            },
            **({"scope": self.scope} if self.scope else {}),
        }

    # ------------------------------------------------------------------------------------------ text

    def to_text(self) -> str:
        lines = [self.summary]
        if self.next_step:
            lines.append(f"Next step: {self.next_step}")
        lines += ["", self._dumps_line()]
        for title, role in (("Root cause", "root_cause"), ("Symptoms", "symptom"), ("Warnings", "warning")):
            found = [f for f in self.findings if f.role == role]
            if not found:
                continue
            lines += ["", f"{title}:"]
            for f in found:
                lines.append(f"  [{f.kind}] {f.message}")
                if f.role == "root_cause" and f.next_step and f.next_step != self.next_step:
                    lines.append(f"      next step: {f.next_step}")
                for key, value in _evidence_lines(f):
                    lines.append(f"      {key}: {value}")
        stacks = [(f, s) for f in self.root_causes for s in f.stacks]
        if stacks:
            lines += ["", "Stack of the culprit's last entry (innermost first):"]
            for f, s in stacks[:4]:
                lines.append(f"  rank {s['rank']}, last entry {s['what']}:")
                for frame in s["frames"][:12]:
                    lines.append(f"    {frame['name']} at {frame['filename']}:{frame['line']}")
        return "\n".join(lines).rstrip() + "\n"

    def _dumps_line(self) -> str:
        d = self.dumps
        others = [f"{w.replace('_', ' ')} writer" for w in sorted(d.writers) if w != "pytorch"]
        text = (f"Dumps: {d.loaded} of {d.world_size} ranks loaded (recorder {', '.join(d.versions) or '?'}"
                f"{'; ' + ', '.join(others) if others else ''})")
        if d.missing_ranks:
            text += f"; missing: ranks {format_ranks(d.missing_ranks)}"
        if d.refused:
            text += f"; {len(d.refused)} file(s) refused as no dump"
        if d.unreadable:
            text += f"; {len(d.unreadable)} unreadable"
        if d.fast_reader_declined:
            reasons = sorted({x["reason"] for x in d.fast_reader_declined})
            text += (f"; {len(d.fast_reader_declined)} file(s) read by the unpickler, as the fast reader found them "
                     f"{reasons[0]}" + (f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""))
        if d.only_active:
            text += ("; written with only their unfinished entries (TORCH_INCLUDE_ONLY_ACTIVE): how far each rank got "
                     "is read from its pg_status, and no finished collective is left to compare shapes or times with")
        if d.window:
            text += f"; {window_said(d.window)}"
        if self.scope:
            sc = self.scope
            text += (f"; scope: --pg {sc['pg']}, {sc['groups']} of {sc['of_groups']} groups (ranks can be waiting in "
                     "the others)")
        if d.host_source == "none" and d.world_size > 1:
            text += f"; {NO_HOSTS_HINT}"
        if d.empty_host_folders:
            text += f"; host folders with no dump: {listed(d.empty_host_folders, 5)}"
        elif d.host_source == "one host folder":
            text += "; all in one host's folder (if the job had more hosts, their dumps are not here)"
        if d.host_source == "ranks per host":
            text += ("; host names are numbered from --ranks-per-host (host<k> holds the k-th run of ranks), not "
                     "read from the job: map them to real hosts before draining")
        return text

    def to_markdown(self) -> str:
        lines = [f"## flightrec: {self.verdict.upper()}", "", f"**{self.summary}**", ""]
        if self.next_step:
            lines += [f"Next step: {self.next_step}", ""]
        lines += [self._dumps_line(), ""]
        c = self.culprits
        if any(c.values()):
            lines += ["| culprit | value |", "|---|---|"]
            if c["ranks"]:
                lines.append(f"| ranks | {format_ranks(c['ranks'])} |")
            if c["hosts"]:
                lines.append(f"| hosts | {', '.join(c['hosts'])} |")
            if c["links"]:
                lines.append(f"| links | {', '.join(' <-> '.join(x) for x in c['links'])} |")
            if c["switches"]:
                lines.append(f"| switches | {', '.join(c['switches'])} |")
            for key, label in (("hosts_to_drain", "hosts to drain"), ("ranks_to_inspect", "ranks to look at"),
                               ("ranks_with_other_code", "ranks that ran other code")):
                if c[key]:
                    lines.append(f"| {label} | {format_ranks(c[key]) if 'ranks' in key else ', '.join(c[key])} |")
            if c["links_to_check"]:
                lines.append(f"| links to test | {', '.join(' <-> '.join(x) for x in c['links_to_check'])} |")
            lines.append("")
        lines += ["| role | kind | finding |", "|---|---|---|"]
        for f in self.findings:
            lines.append(f"| {f.role} | {f.kind} | {f.message.replace('|', '/')} |")
        stacks = [s for f in self.root_causes for s in f.stacks]
        if stacks:
            s = stacks[0]
            lines += ["", f"<details><summary>Stack of rank {s['rank']}, last entry {s['what']}</summary>", "", "```"]
            lines += [f"{fr['name']} at {fr['filename']}:{fr['line']}" for fr in s["frames"][:12]]
            lines += ["```", "</details>"]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        # (the dataclass's own repr printed every finding with its stack frames: pages, in a terminal)
        roles = [f.role for f in self.findings]
        counts = ", ".join(f"{roles.count(r)} {r.replace('_', ' ')}{'s' if roles.count(r) != 1 else ''}"
                           for r in ("root_cause", "symptom", "warning") if r in roles)
        return (f"<Report {self.verdict}: {self.summary[:160]}{'...' if len(self.summary) > 160 else ''} "
                f"({counts or 'no findings'}; .to_text() for all of it)>")

    def _repr_html_(self) -> str:
        colour = {"healthy": "#2e7d32", "fault": "#c62828", "inconclusive": "#ef6c00"}[self.verdict]
        rows = "".join(
            f"<tr><td>{html.escape(f.role)}</td><td>{html.escape(f.kind)}</td><td>{html.escape(f.message)}</td></tr>"
            for f in self.findings
        )
        return (
            f"<div><p style='color:{colour};font-weight:bold'>{html.escape(self.summary)}</p>"
            f"<p>{html.escape(self._dumps_line())}</p>"
            f"<table><tr><th>role</th><th>kind</th><th>finding</th></tr>{rows}</table></div>"
        )

    def __str__(self) -> str:
        return self.to_text()


def _evidence_lines(f: Finding) -> list[tuple[str, str]]:
    out = []
    for key, value in f.evidence.items():
        if isinstance(value, str) and value and value in f.message:
            continue   # (said in the message already: each thing once)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value) and all(
                v in f.message for v in value):
            continue
        if value == [] or value is None:
            continue   # (nothing to show)
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            value = format_ranks(value)
        elif isinstance(value, list):
            value = listed((_evidence_item(v) for v in value), 12)
        out.append((key.replace("_", " "), str(value)))
    return out


def _evidence_item(value) -> str:
    """One item of a listed piece of evidence, as a person reads it: a link as `a <-> b`, a file as `path
    (reason)`, a record as `key value, ...`."""
    if isinstance(value, list):
        return " <-> ".join(map(str, value))
    if isinstance(value, dict):
        if set(value) == {"path", "reason"}:
            return f"{value['path']} ({value['reason']})"
        return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in value.items())
    return str(value)


def window_said(window: dict[str, int]) -> str:
    """How much of the history a distributed analysis read (`DumpSummary.window`), in a clause."""
    n, left, whole = window["entries_per_rank"], window["entries_left_out"], window.get("ranks_kept_whole", 0)
    said = (f"the newest {n:,} entries of each rank analysed, as if the recorder kept that many ({left:,} older ones "
            "left out" if left else f"every entry read analysed (none older than each rank's newest {n:,}")
    said += f"; {whole:,} ranks' dumps kept whole: their unfinished entries only, or Gloo's)" if whole else ")"
    return f"{said}, from {window['shards']:,} shards"
