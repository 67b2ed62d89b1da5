"""The command line: exact exit codes, JSON on stdout, stderr for everything else, no tracebacks."""

import json
import re
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from flightrec.cli import main
from flightrec.testing import synth

from .conftest import FIXTURES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def hung(make_job):
    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="not_joined", rank=6))
    out, _ = make_job(job, per_host_folders=True)
    return out


@pytest.fixture
def healthy(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2))
    return out


def test_analyze_json_fault(runner, hung):
    result = runner.invoke(main, ["analyze", str(hung), "--format", "json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["verdict"] == "fault"
    assert data["culprits"] == {"ranks": [6], "hosts": ["node00001"], "links": [], "switches": [],
                                "hosts_to_drain": [], "links_to_check": [], "ranks_to_inspect": [6],
                                "ranks_with_other_code": []}
    assert "Traceback" not in result.stderr


def test_analyze_healthy_exit_0(runner, healthy):
    result = runner.invoke(main, ["analyze", str(healthy)])
    assert result.exit_code == 0
    assert result.stdout.startswith("HEALTHY:")


def test_text_first_line_is_the_summary(runner, hung):
    text = runner.invoke(main, ["analyze", str(hung)]).stdout
    data = json.loads(runner.invoke(main, ["analyze", str(hung), "-f", "json"]).stdout)
    assert text.splitlines()[0] == data["summary"]
    assert "\x1b[" not in text  # no colour when not on a terminal


def test_markdown_and_output_file(runner, hung, tmp_path):
    out = tmp_path / "incident.md"
    result = runner.invoke(main, ["analyze", str(hung), "--format", "markdown", "-o", str(out)])
    assert result.exit_code == 1
    assert result.stdout == ""
    md = out.read_text()
    assert md.startswith("## flightrec: FAULT") and "| ranks | 6 |" in md


def test_hosts_file_and_ranks_per_host(runner, make_job, tmp_path):
    out, _ = make_job(synth.Job(tp=4, pp=2, dp=2, fault=synth.Fault(kind="not_joined", rank=6)))
    hosts = tmp_path / "hosts.csv"
    hosts.write_text("rank,host\n" + "".join(f"{r},gpu-{r // 4}\n" for r in range(16)))
    data = json.loads(runner.invoke(main, ["analyze", str(out), "-f", "json", "--hosts", str(hosts)]).stdout)
    assert data["culprits"]["hosts"] == ["gpu-1"]
    assert data["dumps"]["host_source"] == "hosts file"
    data = json.loads(runner.invoke(main, ["analyze", str(out), "-f", "json", "--ranks-per-host", "8"]).stdout)
    assert data["culprits"]["hosts"] == ["host0"]
    assert data["dumps"]["host_source"] == "ranks per host"
    text = runner.invoke(main, ["analyze", str(out), "--ranks-per-host", "8"]).stdout   # (numbered, not real names)
    assert "host names are numbered from --ranks-per-host" in text
    assert "numbered" not in runner.invoke(main, ["analyze", str(out), "--hosts", str(hosts)]).stdout
    hosts_json = tmp_path / "hosts.json"
    hosts_json.write_text(json.dumps({str(r): f"n{r}" for r in range(16)}))
    data = json.loads(runner.invoke(main, ["analyze", str(out), "-f", "json", "--hosts", str(hosts_json)]).stdout)
    assert data["culprits"]["hosts"] == ["n6"]


def test_topology_and_pg_and_prefix_and_no_cache(runner, hung, tmp_path):
    topo = tmp_path / "topo.csv"
    topo.write_text("host,switch\nnode00000,leaf0\nnode00001,leaf0\n")
    result = runner.invoke(main, ["analyze", str(hung), "-f", "json", "--topology", str(topo), "--pg", "tp",
                                  "--prefix", "nccl_trace_rank_", "--no-cache", "--quiet"])
    data = json.loads(result.stdout)
    assert result.exit_code == 1
    assert data["culprits"]["ranks"] == [6]
    assert all(f["process_group"] is None or f["process_group"]["desc"] == "tp" for f in data["findings"])


@pytest.mark.parametrize("args, message", [
    (["analyze", "/does/not/exist"], "no such file"),
    # (the fix that applies: check the prefix just passed, not "pass --prefix")
    (["analyze", "{dir}", "--prefix", "nope_"], "check the prefix"),
    (["analyze", "{dir}", "--hosts", "/does/not/exist.csv"], "cannot read the hosts file"),
    (["analyze", "{dir}", "--pg", "no-such-group"], "no process group"),
    (["entries", "{dir}", "--around", "3"], "--around needs --pg"),
])
def test_bad_input_is_one_line_exit_2(runner, hung, args, message):
    result = runner.invoke(main, [a.format(dir=hung) for a in args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""


def test_usage_error_exit_2(runner):
    result = runner.invoke(main, ["analyze", "--format", "yaml", "x"])
    assert result.exit_code == 2


def test_internal_error_exit_70(runner, hung, monkeypatch):
    from flightrec import api

    def boom(*a, **k):
        raise RuntimeError("kaboom")
    monkeypatch.setattr(api, "analyze", boom)
    result = runner.invoke(main, ["analyze", str(hung)])
    assert result.exit_code == 70
    assert "flightrec bug" in result.stderr and "Traceback" not in result.stderr


def test_warnings_go_to_stderr_and_quiet_silences_them(runner, hung):
    (hung / "node00000" / "nccl_trace_rank_1").write_bytes(b"\x80\x02junk")
    result = runner.invoke(main, ["load", str(hung)])
    assert "warning: rank 1:" in result.stderr
    quiet = runner.invoke(main, ["load", str(hung), "--quiet"])
    assert quiet.stderr == ""


def test_analyze_says_a_dumps_problem_once_in_the_report_not_on_stderr_too(runner, hung):
    (hung / "node00000" / "nccl_trace_rank_1").write_bytes(b"\x80\x02junk")
    result = runner.invoke(main, ["analyze", str(hung)])
    assert "rank 1" not in result.stderr
    assert result.stdout.count("nccl_trace_rank_1") == 1, result.stdout


def test_a_dependencys_deprecation_notice_is_not_shown_to_the_reader(runner, hung, monkeypatch):
    """A dependency's DeprecationWarning (Python 3.12's fork warning was one) is nothing an on-call engineer
    can act on: not shown, while flightrec's own warnings still are."""
    from flightrec import api

    def analyze(*args, **kwargs):
        warnings.warn("pyarrow.something is deprecated", DeprecationWarning, stacklevel=1)
        warnings.warn("a future pyarrow will change", PendingDeprecationWarning, stacklevel=1)
        warnings.warn("--ranks-per-host 8 ignored: the dumps' folders say each rank's host", stacklevel=1)
        return real(*args, **kwargs)

    real = api.analyze
    monkeypatch.setattr(api, "analyze", analyze)
    (hung / "node00000" / "nccl_trace_rank_1").write_bytes(b"\x80\x02junk")
    result = runner.invoke(main, ["analyze", str(hung), "-f", "json"])
    json.loads(result.stdout)
    assert "deprecated" not in result.stderr and "future pyarrow" not in result.stderr
    assert "warning: --ranks-per-host" in result.stderr


def test_load_entries_stacks_groups_convert(runner, hung, tmp_path):
    assert "16 of 16 ranks loaded" in runner.invoke(main, ["load", str(hung)]).stdout
    entries = runner.invoke(main, ["entries", str(hung), "--rank", "6", "--last", "3"]).stdout
    assert len(entries.strip().splitlines()) == 4 and entries.splitlines()[1].startswith("6 ")
    side = runner.invoke(main, ["entries", str(hung), "--pg", "tp", "--rank", "4", "--rank", "6", "--around", "17"])
    assert "rank 4" in side.stdout and "rank 6" in side.stdout
    stacks = runner.invoke(main, ["stacks", str(hung)]).stdout
    assert re.search(r"^1 rank: .* \(completed\)\n    ranks 6$", stacks, re.M)  # the culprit stopped outside
    groups = runner.invoke(main, ["groups", str(hung)]).stdout
    assert "not_joined" in groups and "default_pg" in groups
    out = tmp_path / "pq"
    result = runner.invoke(main, ["convert", str(hung), str(out)])
    assert result.exit_code == 0 and (out / "entries.parquet").exists()
    assert (out / "frames" / "collectives.parquet").exists()
    said = result.stdout.splitlines()   # (what went where, each table named once)
    assert said[0] == f"wrote the shard to {out}: dumps, entries, pg_config, rank_lists, pg_status, stacks"
    assert said[1].startswith(f"wrote {len(list((out / 'frames').iterdir()))} Parquet tables to {out / 'frames'}: ")
    # the export is itself a shard: analysing it reads Parquet only and gives the same answer
    a = json.loads(runner.invoke(main, ["analyze", str(out), "-f", "json"]).stdout)
    b = json.loads(runner.invoke(main, ["analyze", str(hung), "-f", "json"]).stdout)
    assert a["culprits"] == b["culprits"] and a["summary"] == b["summary"]


def test_per_host_shards_analysed_from_parquet_only(runner, make_job, tmp_path):
    """Each host converts its own dumps next to the job; the analysis reads only the shards."""
    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="not_joined", rank=9))
    dumps, _ = make_job(job, per_host_folders=True)
    shards = tmp_path / "shards"
    for host_dir in sorted(dumps.iterdir()):
        flat = tmp_path / "on_host" / host_dir.name       # what the host itself sees: no host in the path
        flat.mkdir(parents=True)
        for f in host_dir.iterdir():
            (flat / f.name).write_bytes(f.read_bytes())
        result = runner.invoke(main, ["convert", str(flat), str(shards / host_dir.name), "--shard-only",
                                      "--host", host_dir.name])
        assert result.exit_code == 0, result.stderr
    assert not list(shards.rglob("nccl_trace_rank_*"))
    data = json.loads(runner.invoke(main, ["analyze", str(shards), "-f", "json"]).stdout)
    assert data["culprits"] == {"ranks": [9], "hosts": ["node00002"], "links": [], "switches": [],
                                "hosts_to_drain": [], "links_to_check": [], "ranks_to_inspect": [9],
                                "ranks_with_other_code": []}
    assert data["dumps"]["loaded"] == 16


def test_every_command_has_help_with_an_example_and_a_readme_mention(runner):
    for name, command in main.commands.items():
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0
        assert "Example" in result.stdout, f"{name} --help has no example"
        assert f"flightrec {name}" in README, f"README does not mention `flightrec {name}`"
    for option in ("--format", "--hosts", "--topology", "--ranks-per-host", "--prefix", "--pg", "--quiet",
                   "--no-cache", "-o"):
        assert option in runner.invoke(main, ["analyze", "--help"]).stdout
        assert option in README


def test_version(runner):
    assert runner.invoke(main, ["--version"]).stdout.startswith("flightrec, version")


def test_dumps_beside_shards_are_named_not_silently_ignored(runner, hung, tmp_path):
    shard = hung / "converted"
    assert runner.invoke(main, ["convert", str(hung / "node00000"), str(shard), "--shard-only"]).exit_code == 0
    result = runner.invoke(main, ["analyze", str(hung), "-f", "json"])
    assert "ignored 16 dump file(s) outside them" in result.stderr  # the pickles stay beside the shard


def test_either_pickle_reader_gives_the_same_report(runner, hung):
    """--reader picks the pickle reader (the compiled tape needs the fast extra): the report is the same."""
    pytest.importorskip("numba")
    reports = [runner.invoke(main, ["analyze", str(hung), "-f", "json", "--no-cache", "--reader", reader])
               for reader in ("tape", "unpickler")]
    assert [r.exit_code for r in reports] == [1, 1]
    tape_report, plain_report = (json.loads(r.stdout) for r in reports)
    assert tape_report == plain_report and tape_report["culprits"]["ranks"] == [6]


def test_the_compiled_reader_without_numba_is_a_clear_usage_error(runner, hung, monkeypatch):
    from flightrec.ingest.fastpickle import walker

    monkeypatch.setattr(walker, "available", lambda: False)
    result = runner.invoke(main, ["analyze", str(hung), "--reader", "tape", "--no-cache"])
    assert result.exit_code == 2
    assert "needs numba" in result.stderr and "'unpickler' reader" in result.stderr and "Traceback" not in result.stderr


def test_convert_never_replaces_a_folder_it_did_not_write(runner, hung, tmp_path, monkeypatch):
    """Converting replaces OUT whole: a folder holding anything else (the dumps themselves, given as OUT by
    mistake) is refused and left as it was; a new folder, or a shard written before, is fine."""
    import importlib

    load_module = importlib.import_module("flightrec.ingest.load")   # (`flightrec.ingest.load` is the function)
    real_load_raw = load_module.load_raw
    monkeypatch.setattr(load_module, "load_raw", lambda *a, **k: pytest.fail("parsed before checking OUT"))
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "notes.txt").write_text("keep")
    dumps_before = sorted(p.name for p in hung.rglob("*"))
    for out in (keep, hung, hung / "node00000"):
        result = runner.invoke(main, ["convert", str(hung), str(out), "-q"])
        assert result.exit_code == 2 and "not empty" in result.stderr, result.output
    assert (keep / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in hung.rglob("*")) == dumps_before
    monkeypatch.setattr(load_module, "load_raw", real_load_raw)
    out = tmp_path / "shard"
    for _ in range(2):   # (the second time over its own earlier shard)
        assert runner.invoke(main, ["convert", str(hung), str(out), "--shard-only", "-q"]).exit_code == 0


def test_an_unwritable_report_path_fails_before_the_analysis(runner, hung, tmp_path, monkeypatch):
    """A typo in -o must not cost the wait for a big job's analysis: exit 2 before loading anything; an error
    writing files elsewhere (a folder not writable) is exit 2 too, not a flightrec bug."""
    from flightrec import api

    def never(*a, **k):
        raise AssertionError("analysed before checking -o")
    # (a context, not monkeypatch.undo(): that also undid the private cache, and the convert below wrote into
    # the user's own)
    with monkeypatch.context() as patch:
        patch.setattr(api, "analyze", never)
        for output, message in ((tmp_path / "no" / "such" / "r.json", "does not exist"),
                                (tmp_path, "is a directory")):
            result = runner.invoke(main, ["analyze", str(hung), "-o", str(output)])
            assert result.exit_code == 2 and message in result.stderr, result.output
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = runner.invoke(main, ["convert", str(hung), str(blocker / "out"), "-q"])
    assert result.exit_code == 2 and "Traceback" not in result.output and "bug" not in result.stderr


def test_python_dash_m_runs_the_command_line():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "flightrec", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and "flightrec" in result.stdout


def test_the_script_leaves_without_teardown_but_with_all_its_output_and_exit_code(runner, hung, tmp_path):
    """`entry` ends the process at once (`os._exit`): the whole report still comes out through a pipe, the exit
    code is the verdict's, an error is one line with exit 2, and the cache it wrote is complete."""
    import subprocess
    import sys

    want = runner.invoke(main, ["analyze", str(hung), "--format", "json", "--no-cache"])
    got = subprocess.run([sys.executable, "-m", "flightrec", "analyze", str(hung), "--format", "json", "-q"],
                         capture_output=True, text=True)
    assert got.returncode == want.exit_code == 1
    assert json.loads(got.stdout) == json.loads(want.stdout)
    many = ["entries", str(hung), "--last", "100000", "-q"]   # (a long output: all of it through the pipe)
    long = subprocess.run([sys.executable, "-m", "flightrec", *many], capture_output=True, text=True)
    assert long.returncode == 0 and long.stdout == runner.invoke(main, many).stdout and len(long.stdout) > 100_000
    again = runner.invoke(main, ["analyze", str(hung), "--format", "json", "-q"])   # (from the cache it wrote)
    assert json.loads(again.stdout) == json.loads(want.stdout)
    bad = subprocess.run([sys.executable, "-m", "flightrec", "analyze", str(tmp_path / "nowhere")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stdout == ""


def test_a_world_size_smaller_than_the_dumps_say_is_warned_about(runner, hung):
    result = runner.invoke(main, ["analyze", str(hung), "--world-size", "4", "--no-cache"])
    assert "world size 4 was given, but the dumps hold rank 15" in result.stderr and "using 16" in result.stderr
    assert "of 16 ranks loaded" in result.output


def test_a_hosts_file_given_as_the_topology_is_refused(runner, hung, tmp_path):
    """A `rank,host` CSV passed to --topology matched no host, so nothing rolled up to a switch, silently."""
    wrong = tmp_path / "hosts.csv"
    wrong.write_text("rank,host\n" + "".join(f"{r},node{r // 4:05d}\n" for r in range(16)))
    result = runner.invoke(main, ["analyze", str(hung), "--topology", str(wrong), "-q"])
    assert result.exit_code == 2 and "names none of the job's hosts" in result.stderr, result.output


def test_analyze_refuses_one_dump_file_instead_of_the_folder(runner):
    """A single rank's file made every other rank 'left no dump' and the culprits, exit 1."""
    from .conftest import FIXTURES

    result = runner.invoke(main, ["analyze", str(FIXTURES / "skip_collective" / "nccl_trace_rank_0"), "-q"])
    assert result.exit_code == 2 and "is a file: analyze reads the folder" in result.stderr, result.output


def test_a_hosts_file_that_leaves_ranks_out_is_warned_about(runner, tmp_path):
    """It named no host for the culprit, silently: a runbook's drain step then drains nothing."""
    from .conftest import FIXTURES

    hosts = tmp_path / "hosts.csv"
    hosts.write_text("rank,host\n0,nodeA\n")
    result = runner.invoke(main, ["analyze", str(FIXTURES / "skip_collective"), "--hosts", str(hosts), "--no-cache"])
    assert result.exit_code == 1 and "names no host for 3 of the job's 4 ranks (1-3)" in result.stderr, result.output


@pytest.mark.parametrize("args, says", [
    (["--rank", "9"], "rank 9 is not in this job (ranks 0-3)"),
    (["--pg", "default_pg", "--around", "100"], "its entries run #1-#8"),
])
def test_entries_out_of_range_say_so_instead_of_no_rows(runner, args, says):
    from .conftest import FIXTURES

    result = runner.invoke(main, ["entries", str(FIXTURES / "skip_collective"), "-q", *args])
    assert result.exit_code == 2 and says in result.stderr, result.output


def test_pg_says_the_scope_and_that_a_rank_went_on_to_a_group_left_out(runner):
    """--pg dp on subgroups_per_host named ranks 4, 6, 7, which wait in tp on rank 5, as not joining dp, and
    nothing said the view was restricted."""
    import jsonschema

    from .conftest import FIXTURES
    from .test_analyze_synth import SCHEMA

    result = runner.invoke(main, ["analyze", str(FIXTURES / "subgroups_per_host"), "--pg", "dp", "-f", "json", "-q"])
    report = json.loads(result.output)
    jsonschema.validate(report, SCHEMA)
    assert report["scope"] == {"pg": "dp", "groups": 4, "of_groups": 7}
    outside = {r for f in report["findings"] if f["kind"] == "not_joined"
               and "left out of this analysis" in f["evidence"]["note"] for r in f["ranks"]}
    assert outside == {4, 6, 7}
    whole = runner.invoke(main, ["analyze", str(FIXTURES / "subgroups_per_host"), "-f", "json", "-q"])
    assert "scope" not in json.loads(whole.output)


def test_timing_shows_the_rank_that_joined_past_the_timeout(runner):
    """late_rank: analyze names rank 2 (5.5 s late on one all_reduce); timing showed it on time (median 0.8 ms)."""
    from .conftest import FIXTURES

    result = runner.invoke(main, ["timing", str(FIXTURES / "late_rank"), "-q"])
    assert result.exit_code == 0
    section = result.output.split("Joined a collective past its timeout")[1].split("Ranks, latest first")[0]
    assert section.splitlines()[2].split()[:1] == ["2"] and "5500.1" in section, result.output


def test_load_lists_a_dump_read_with_a_problem_even_when_quiet(runner, tmp_path):
    """A dump cut to 80% read as '4 of 4 ranks loaded' and nothing else under -q (the warning went to stderr)."""
    import shutil

    from .conftest import FIXTURES

    job = tmp_path / "job"
    shutil.copytree(FIXTURES / "skip_collective", job)
    victim = job / "nccl_trace_rank_1"
    victim.write_bytes(victim.read_bytes()[: int(victim.stat().st_size * 0.8)])
    result = runner.invoke(main, ["load", str(job), "-q", "--no-cache"])
    assert result.exit_code == 0 and "read with a problem nccl_trace_rank_1: truncated file" in result.output


def test_ranks_per_host_overridden_by_the_dumps_says_so(runner):
    from .conftest import FIXTURES

    result = runner.invoke(main, ["analyze", str(FIXTURES / "subgroups_per_host"), "--ranks-per-host", "2"])
    assert "--ranks-per-host 2 ignored: the dumps' folders or names say each rank's host" in result.stderr
    assert "host node1" in result.output


def test_entries_around_lines_up_a_pipelines_sends_by_their_own_counter(runner, make_job):
    """--pg pp --around 3 showed only collective_seq_id 0 (sends are numbered by p2p_seq_id), one column per rank
    of every pp group, cells cut at 48 characters."""
    from flightrec.testing import synth

    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2))
    text = runner.invoke(main, ["entries", str(out), "--pg", "pp", "--around", "3", "-q"]).stdout
    first = text.split("\n\n")[0].splitlines()
    assert first[0].startswith("group ") and "(desc 'pp'), ranks " in first[0]
    header, rows = first[1].split(), first[2:]
    assert header[:2] == ["kind", "seq_id"] and len(header) == 2 + 2 * 2   # kind, seq_id, two member ranks
    assert [r.split()[:2] for r in rows] == [["p2p", str(s)] for s in range(1, 9)][: len(rows)] and len(rows) >= 4
    assert all(len(r.split()) > 4 and "-" not in r.split()[2:] for r in rows), text


def test_output_piped_into_head_ends_quietly(hung):
    """`flightrec ... | head` printed 'error: Broken pipe' once head had read enough."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "flightrec", "entries", str(hung), "--last", "10000", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()   # (as head does, with most of the output, far past a pipe's buffer, still to write)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"error" not in err, err


def test_cache_lists_the_prefix_each_cache_was_read_with(runner):
    from .conftest import FIXTURES

    for prefix in ([], ["--prefix", "nccl_trace_rank_"]):
        assert runner.invoke(main, ["load", str(FIXTURES / "healthy"), "-q", *prefix]).exit_code == 0
    listed = runner.invoke(main, ["cache"]).stdout
    assert "--prefix" in listed.splitlines()[0]
    rows = [line.split()[1] for line in listed.splitlines()[1:] if line.startswith(str(FIXTURES / "healthy") + " ")]
    assert sorted(rows) == ["(any)", "nccl_trace_rank_"], listed


def test_every_table_command_writes_json(runner):
    """load, groups, entries (and side by side), stacks and timing: JSON for scripts; entries carry seconds since
    the job's first entry beside the raw stamps, and Gloo's `retired`, its only sign of completion."""
    job = str(FIXTURES / "skip_collective")
    load = json.loads(runner.invoke(main, ["load", job, "-f", "json"]).stdout)
    assert (load["loaded"], load["world_size"], load["backends"]) == (4, 4, ["gloo"])
    groups = json.loads(runner.invoke(main, ["groups", job, "-f", "json"]).stdout)
    assert groups[0]["ranks"] == [0, 1, 2, 3] and groups[0]["last_status"] == "not_joined"
    entries = json.loads(runner.invoke(main, ["entries", job, "-f", "json", "--rank", "2", "--last", "2"]).stdout)
    assert [e["collective_seq_id"] for e in entries] == [6, 7] and all(e["retired"] is True for e in entries)
    assert 0 < entries[0]["created_s"] < entries[1]["created_s"] < 60
    side = json.loads(runner.invoke(main, ["entries", job, "-f", "json", "--pg", "default_pg", "--around", "8"]).stdout)
    assert side[0]["rows"][-1] == {"seq_id": 8, "rank 0": "all_reduce scheduled", "rank 1": "all_reduce scheduled",
                                   "rank 2": None, "rank 3": "all_reduce scheduled"}
    stacks = json.loads(runner.invoke(main, ["stacks", job, "-f", "json"]).stdout)
    assert sorted(r for s in stacks for r in s["ranks"]) == [0, 1, 2, 3]
    timing = json.loads(runner.invoke(main, ["timing", str(FIXTURES / "straggler"), "-f", "json"]).stdout)
    assert [r["rank"] for r in timing["ranks"] if r["straggler"]] == [2]


def test_entries_text_shows_seconds_since_start_and_retired(runner):
    out = runner.invoke(main, ["entries", str(FIXTURES / "skip_collective"), "--rank", "2", "--last", "1"]).stdout
    header = out.splitlines()[0].split()
    assert "created_s" in header and "retired" in header


def test_the_command_line_starts_without_the_engine():
    """`flightrec --help` (and a usage error) must answer at once: the CLI imports the engine, Polars and Arrow
    only when a command runs (the figure, under 0.3 s, is `python -m bench.startup`'s)."""
    import subprocess
    import sys

    code = ("import sys\nfrom flightrec.cli import main\n"
            "heavy = [m for m in ('polars', 'pyarrow', 'numpy', 'numba', 'flightrec.api') if m in sys.modules]\n"
            "print(heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
