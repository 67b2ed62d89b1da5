"""The incident log across incidents (`flightrec.history`): a planted repeat offender is flagged and a one-off
is not; recording is idempotent and atomic; old logs are migrated; a locked, corrupt or foreign file, a report
of another version and a folder that is no incident are each one clear line, and lose nothing recorded."""

from __future__ import annotations

import json
import shutil
import sqlite3
import warnings

import pytest
from click.testing import CliRunner

from flightrec import analyze
from flightrec.cli import main
from flightrec.history import History, HistoryError, backfill, hosts_by_week, incidents, named, offenders
from flightrec.history.store import _SCHEMA, incident_id
from flightrec.testing import synth

from .conftest import FIXTURES


def _report(out) -> dict:
    """The report of one fleet incident, dated by its folder's week: the generator runs every job on one clock,
    and a fleet's incidents come days apart (`last_entry_at` is what the log reads the time from)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the lost dumps' problems are findings in the report)
        report = analyze(out, use_cache=False).to_dict()
    week, half = int(out.name[4]), out.name[-1]
    report["dumps"]["last_entry_at"] = f"2026-11-{2 + 7 * (week - 1) + (half == 'b'):02d}T03:00:00+00:00"
    return report


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Six incidents: node00001 down three times (at different steps, so at different times), node00003 down
    once, rank 5 stopped once, and a healthy job."""
    root = tmp_path_factory.mktemp("fleet")
    jobs = {
        "week1-a": synth.Fault(kind="host_down", rank=2, step=1),
        "week1-b": synth.Fault(kind="host_down", rank=3, step=2),
        "week2-a": synth.Fault(kind="host_down", rank=2, step=3),
        "week2-b": synth.Fault(kind="host_down", rank=6, step=2),
        "week3-a": synth.Fault(kind="not_joined", rank=5, step=1),
        "week3-b": synth.Fault(kind="none"),
    }
    for name, fault in jobs.items():
        synth.generate(synth.Job(tp=2, pp=2, dp=2, steps=4, ranks_per_host=2, fault=fault), root / name,
                       per_host_folders=True)
    return root


def test_a_planted_repeat_offender_is_flagged_and_a_one_off_is_not(fleet, tmp_path):
    with History(tmp_path / "h.sqlite") as log:
        for folder in sorted(p for p in fleet.iterdir() if p.is_dir()):
            log.record(_report(folder), folder)
        found = offenders(log)
        assert incidents(log).height == 6
    hosts = {name: row for name, row in zip(found["name"], found.iter_rows(named=True)) if row["what"] == "host"}
    assert hosts["node00001"]["incidents"] == 3 and hosts["node00001"]["repeat"]
    assert "drain it permanently" in hosts["node00001"]["recommendation"]
    assert hosts["node00001"]["kinds"] == ["missing_dump"] and hosts["node00001"]["actions"] == ["drain_host"]
    assert hosts["node00001"]["first_seen"] < hosts["node00001"]["last_seen"]
    assert hosts["node00003"]["incidents"] == 1 and not hosts["node00003"]["repeat"]
    assert hosts["node00003"]["recommendation"] == ""
    assert found.row(0, named=True)["name"] == "node00001"   # (the most often named first)
    assert hosts["node00002"]["actions"] == ["inspect_process"] and not hosts["node00002"]["repeat"]   # (rank 5)
    assert found.filter(found["what"] == "rank").height == 0   # (every rank's host was named with it)


def test_history_answers_which_hosts_should_leave_the_pool_for_good(fleet, tmp_path):
    """One command: the backfill records every folder, the table flags node00001; text, JSON and markdown."""
    runner = CliRunner()
    db = str(tmp_path / "h.sqlite")
    result = runner.invoke(main, ["history", "--scan", str(fleet), "--db", db, "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "6 recorded, 0 already in the log, 0 failed" in result.stderr
    assert "6 analyses recorded in the whole log (5 fault, 1 healthy); named in 2 or more: host node00001" in result.stdout
    assert "drain it permanently" in result.stdout
    data = json.loads(runner.invoke(main, ["history", "--db", db, "-f", "json"]).stdout)
    flagged = [o for o in data["offenders"] if o["repeat"]]
    assert [(o["what"], o["name"], o["incidents"]) for o in flagged] == [("host", "node00001", 3)]
    assert data["incidents"] == 6
    markdown = runner.invoke(main, ["history", "--db", db, "-f", "markdown"]).stdout
    assert "| **repeat** | host | node00001 | 3 |" in markdown
    assert "in: week1-a, week1-b, week2-a" in result.stdout   # (which incidents, to look at)
    # (scanned again: nothing new to analyse)
    again = runner.invoke(main, ["history", "--scan", str(fleet), "--db", db, "-q"])
    assert "0 recorded, 6 already in the log, 0 failed" in again.stderr


def test_the_window_leaves_older_incidents_out(fleet, tmp_path):
    with History(tmp_path / "h.sqlite") as log:
        for folder in sorted(p for p in fleet.iterdir() if p.is_dir())[:2]:
            log.record(_report(folder), folder)
        assert incidents(log, "2026-11-01").height == 2
        assert incidents(log, "2026-11-03").height == 1   # (week1-a was on the 2nd)
        assert incidents(log, "7d").height == 0           # (weeks ago)
        assert offenders(log, "7d").height == 0
        weeks = hosts_by_week(log)
        assert weeks["name"].to_list() == ["node00001"] and weeks["incidents"].to_list() == [2]
    with pytest.raises(Exception, match="give a span"), History(tmp_path / "h.sqlite") as log:
        incidents(log, "last tuesday")


def test_recording_the_same_incident_twice_keeps_one(tmp_path):
    """Twice, from a copy under another name, and as its JSON twin: one incident (a copy must not make a host
    a repeat offender); recorded again without a folder, it keeps the folder it was read from."""
    report = analyze(FIXTURES / "skip_collective", use_cache=False).to_dict()
    copy = tmp_path / "inc-2026-12-01-skip"
    shutil.copytree(FIXTURES / "skip_collective", copy)
    with History(tmp_path / "h.sqlite") as log:
        first = log.record(report, FIXTURES / "skip_collective")
        second = log.record(report)
        third = log.record(analyze(copy, use_cache=False).to_dict(), copy)
        twin = log.record(analyze(FIXTURES / "skip_collective_json", use_cache=False).to_dict())
        assert first.incident_id == second.incident_id == third.incident_id == twin.incident_id
        assert (first.replaced, second.replaced, third.replaced, twin.replaced) == (False, True, True, True)
        assert incidents(log).height == 1
        assert incidents(log)["path"].to_list() == [str(copy.resolve())]
        assert named(log)["name"].to_list() == ["2"]   # (no host known: the rank itself)
        assert incident_id(report) != incident_id(analyze(FIXTURES / "dead_rank", use_cache=False).to_dict())


def test_a_report_of_another_version_is_refused_and_nothing_recorded(tmp_path):
    report = analyze(FIXTURES / "skip_collective", use_cache=False).to_dict()
    with History(tmp_path / "h.sqlite") as log:
        with pytest.raises(HistoryError, match="a report of version 1: this flightrec records version 2"):
            log.record(dict(report, report_version=1))
        with pytest.raises(HistoryError, match="a report of version '2'"):
            log.record(dict(report, report_version="2"))
        for bad in (dict(report, dumps=dict(report["dumps"], last_entry_at="yesterday")),
                    dict(report, dumps=None), dict(report, findings=[{"kind": "x"}])):
            with pytest.raises(HistoryError, match="not a flightrec report"):
                log.record(bad)
        assert incidents(log).height == 0


def test_a_recording_that_fails_half_way_leaves_nothing_of_it(tmp_path):
    report = analyze(FIXTURES / "skip_collective", use_cache=False).to_dict()
    broken = json.loads(json.dumps(report))
    broken["findings"][-1]["ranks"] = [{2}]   # (passes the checks, fails as JSON: after the incident's row is in)
    with History(tmp_path / "h.sqlite") as log:
        log.record(report)
        other = dict(broken, dumps=dict(broken["dumps"], last_entry_ns=1, folder="another"))
        with pytest.raises(TypeError):
            log.record(other)
        assert incidents(log)["job"].to_list() == ["skip_collective"]
        assert log.rows("SELECT count(*) FROM findings WHERE incident_id = ?", [incident_id(other)]) == [(0,)]


def test_a_log_of_the_first_schema_is_migrated_with_its_incidents(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    for statement in _SCHEMA[1]:
        db.execute(statement)
    db.execute("INSERT INTO incidents VALUES ('x1', 'job7', NULL, '2026-11-01T00:00:00+00:00', 'fault', 's', 16, "
               "'[\"2.10\"]', '0.1.0', 2, '2026-11-01T01:00:00+00:00')")
    db.execute("INSERT INTO findings VALUES ('x1', 0, 'missing_dump', 'root_cause', 'drain_host', 'm', '[4, 5]', "
               "'[\"node2\"]', '[]', '{}')")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with History(path) as log:
        assert log.rows("PRAGMA user_version") == [(2,)]
        assert log.rows("SELECT what, name FROM culprits ORDER BY what, name") == [
            ("host", "node2"), ("rank", "4"), ("rank", "5")]
        assert named(log).select("what", "name").rows() == [("host", "node2")]


def test_a_log_from_a_newer_flightrec_is_left_alone(tmp_path):
    path = tmp_path / "new.sqlite"
    sqlite3.connect(path).execute("PRAGMA user_version = 99")
    with pytest.raises(HistoryError, match="newer flightrec"):
        History(path)


@pytest.mark.parametrize("content, message", [(b"this is not sqlite at all" * 40, "not a readable incident log")])
def test_a_corrupt_log_is_one_clear_line_and_left_as_it_was(tmp_path, content, message):
    path = tmp_path / "h.sqlite"
    path.write_bytes(content)
    with pytest.raises(HistoryError, match=message):
        History(path)
    assert path.read_bytes() == content
    result = CliRunner().invoke(main, ["history", "--db", str(path)])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_another_programs_sqlite_file_is_not_taken_for_a_log(tmp_path):
    path = tmp_path / "other.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE notes (x)")
    with pytest.raises(HistoryError, match="not a flightrec incident log"):
        History(path)


def test_a_locked_log_says_so_and_the_verdict_still_stands(tmp_path):
    path = tmp_path / "h.sqlite"
    History(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        report = analyze(FIXTURES / "skip_collective", use_cache=False).to_dict()
        with pytest.raises(HistoryError, match="in use by another process"):
            History(path, timeout=0.1).record(report)
        result = CliRunner().invoke(main, ["analyze", str(FIXTURES / "skip_collective"), "--record", "--db",
                                           str(path), "--no-cache"], env={"FLIGHTREC_HISTORY_DB": str(path)})
        assert result.exit_code == 1 and result.stdout.startswith("FAULT")   # (the verdict's exit code)
        assert "warning: not recorded:" in result.stderr and "in use by another process" in result.stderr
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_record_takes_reports_and_says_which_it_could_not(tmp_path):
    runner = CliRunner()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(analyze(FIXTURES / "skip_collective", use_cache=False).to_dict()))
    old = tmp_path / "old.json"
    old.write_text(json.dumps(dict(json.loads(good.read_text()), report_version=1)))
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2, 3]")
    db = str(tmp_path / "h.sqlite")
    result = runner.invoke(main, ["record", str(good), str(old), str(junk), "--db", db])
    assert result.exit_code == 2
    assert f"{good}: recorded (new)" in result.stdout
    assert f"{old}: not recorded: " in result.stderr and "version 1" in result.stderr
    assert f"{junk}: not recorded: not a flightrec report" in result.stderr and "Traceback" not in result.output
    with History(db) as log:
        assert incidents(log).height == 1


def test_a_folder_that_is_no_incident_is_one_line_and_the_rest_recorded(tmp_path):
    root = tmp_path / "incidents"
    shutil.copytree(FIXTURES / "skip_collective", root / "a", ignore=shutil.ignore_patterns("*.json", "*.txt"))
    shutil.copytree(FIXTURES / "dead_rank", root / "b", ignore=shutil.ignore_patterns("*.json", "*.txt"))
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("not a dump")
    with History(tmp_path / "h.sqlite") as log:
        done = backfill(log, root, workers=2)
        assert sorted(p.rsplit("/", 1)[-1] for p in done.recorded) == ["a", "b"]
        assert [(f.rsplit("/", 1)[-1], "no dump files" in why) for f, why in done.failed] == [("notes", True)]
        assert incidents(log).height == 2


def test_the_notebook_figures_draw_the_history(fleet, tmp_path):
    pytest.importorskip("matplotlib")
    from flightrec import plots

    with History(tmp_path / "h.sqlite") as log:
        for folder in sorted(p for p in fleet.iterdir() if p.is_dir()):
            log.record(_report(folder), folder)
        over_time = plots.incidents_over_time(named(log))
        heat = plots.hosts_heat_map(hosts_by_week(log))
    labels = [t.get_text() for t in over_time.axes[0].get_yticklabels()]
    assert labels[-1] == "node00001" and set(labels) == {"node00001", "node00002", "node00003"}   # (top: most)
    assert [t.get_text() for t in heat.axes[0].get_yticklabels()] == ["node00001", "node00002", "node00003"]
    assert len(heat.axes[0].get_xticklabels()) == 3   # (the three weeks)


def test_a_query_never_makes_a_log_and_a_mistyped_one_says_so(tmp_path):
    result = CliRunner().invoke(main, ["history", "--db", str(tmp_path / "nope" / "histroy.sqlite")])
    assert result.exit_code == 2 and "no incident log there" in result.stderr
    assert not (tmp_path / "nope").exists()


def test_scanning_one_incidents_own_folder_is_refused(tmp_path):
    """Its host folders are no incidents (each would read as a job with half its ranks lost)."""
    for folder in ("subgroups_per_host", "dead_rank"):
        result = CliRunner().invoke(main, ["history", "--scan", str(FIXTURES / folder), "--db",
                                           str(tmp_path / "h.sqlite")])
        assert result.exit_code == 2 and "holds one incident's dumps" in result.stderr, result.output
    one = tmp_path / "incidents"
    shutil.copytree(FIXTURES / "subgroups_per_host", one / "only", ignore=shutil.ignore_patterns("*.json", "*.txt"))
    with History(tmp_path / "h.sqlite") as log:
        assert backfill(log, one, workers=1).recorded == [str(one / "only")]   # (one incident folder under it)


def test_a_scan_with_a_folder_that_fails_exits_2_for_cron(tmp_path):
    root = tmp_path / "incidents"
    shutil.copytree(FIXTURES / "dead_rank", root / "a", ignore=shutil.ignore_patterns("*.json", "*.txt"))
    (root / "junk").mkdir()
    result = CliRunner().invoke(main, ["history", "--scan", str(root), "--db", str(tmp_path / "h.sqlite"), "-q"])
    assert result.exit_code == 2 and "1 recorded, 0 already in the log, 1 failed" in result.stderr


def _record_one(args) -> str:
    path, report = args
    try:
        with History(path) as log:
            log.record(report)
        return "ok"
    except HistoryError as exc:
        return str(exc)


def test_processes_opening_a_new_log_at_once_all_record(tmp_path):
    """A fabric outage hangs many jobs at once: each `analyze --record` may be the one to make the log."""
    import multiprocessing

    base = analyze(FIXTURES / "dead_rank", use_cache=False).to_dict()
    reports = [dict(base, dumps=dict(base["dumps"], last_entry_ns=i + 1)) for i in range(4)]
    for attempt in range(3):
        path = tmp_path / f"h{attempt}.sqlite"
        with multiprocessing.get_context("spawn").Pool(4) as pool:
            results = pool.map(_record_one, [(path, r) for r in reports])
        assert results == ["ok"] * 4, results
        with History(path) as log:
            assert incidents(log).height == 4


def test_a_time_the_log_cannot_read_does_not_break_the_history(tmp_path):
    path = tmp_path / "h.sqlite"
    with History(path) as log:
        log.record(analyze(FIXTURES / "dead_rank", use_cache=False).to_dict())
        log.db.execute("UPDATE incidents SET hang_at = 'yesterday'")
        assert offenders(log).height == 1 and incidents(log)["at"].to_list() == [None]


def test_since_reads_spans_dates_and_offsets():
    from datetime import UTC, datetime

    from flightrec.errors import FlightrecError
    from flightrec.history.offenders import since_time

    now = datetime(2026, 12, 4, 12, tzinfo=UTC)
    assert since_time("12h", now) == "2026-12-04T00:00:00+00:00"
    assert since_time("2w", now) == "2026-11-20T12:00:00+00:00"
    assert since_time("2026-12-01T03:00+02:00") == "2026-12-01T01:00:00+00:00"
    for bad in ("1m", "99999999999d", "last tuesday"):
        with pytest.raises(FlightrecError, match="hours, days or weeks"):
            since_time(bad, now)
