"""Every recorded fixture through the API and the CLI: the injected culprit is named, healthy is healthy."""

import json
import warnings

import jsonschema
import polars as pl
import pytest
from click.testing import CliRunner

from flightrec import analyze
from flightrec.cli import main

from . import golden
from .conftest import FIXTURES, expected, recorded_cases
from .test_analyze_synth import SCHEMA

ROOT_KINDS = {"not_joined", "missing_dump", "mismatch"}

# rolled_past_*: rank 5 stopped joining a group and its ring buffer (6 entries) has none of that group's entries
# left; only its pg_status says how far it got.
ROLLED = ["rolled_past_default", "rolled_past_dp"]


def _has_root_cause(fault: dict) -> bool:
    # a straggler is a root cause when it made a collective time out (late_rank), else a warning (straggler)
    return fault.get("kind") in ROOT_KINDS or (fault.get("kind") == "straggler" and bool(fault.get("collective_seq_id")))


def _analyze(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(FIXTURES / case)


@pytest.mark.parametrize("case", recorded_cases())
def test_api_names_the_injected_fault(case):
    truth = expected(case)
    fault = truth["fault"] or {}
    report = _analyze(case)
    jsonschema.validate(report.to_dict(), SCHEMA)
    if fault.get("needs_world_size"):
        # (host_down: Gloo lists no world once a job makes subgroups; the lost last host shows only given the size)
        # the numbered groups skip one none of the ranks read is in: the job had more ranks than these dumps show
        assert report.verdict == "inconclusive", report.summary
        assert [f.kind for f in report.findings] == ["world_size_unknown"]
        # (record_gloo.py makes the per-host tp groups first, in host order: node1's is named '2')
        assert report.findings[0].evidence["unseen_groups"] == ["2"]
        assert "--world-size" in report.next_step and report.culprits["hosts_to_drain"] == []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sized = analyze(FIXTURES / case, world_size=fault["needs_world_size"])
        assert sized.verdict == "inconclusive" and sized.trace.missing_ranks == fault["ranks"], sized.summary
        missing = [f for f in sized.findings if f.kind == "missing_dump"]
        assert [f.ranks for f in missing] == [fault["ranks"]]
        assert "world_size_unknown" not in [f.kind for f in sized.findings]
        # nobody provably waits on the lost host: collect its dumps first, drain it if it wrote none
        assert missing[0].action == "recollect_dumps" and sized.culprits["hosts_to_drain"] == []
    elif fault.get("indistinguishable_from"):
        # (pipeline_stall: ranks blocked in a receive Gloo neither records nor counts read as the culprit does)
        assert report.verdict == "inconclusive" and report.culprits["ranks"] == [], report.summary
        suspects = report.findings[0]
        assert suspects.evidence["in_unrecorded_transfers"] == "suspects"
        assert suspects.ranks == sorted(fault["ranks"] + fault["indistinguishable_from"])
    elif _has_root_cause(fault):
        assert report.verdict == "fault"
        assert report.culprits["ranks"] == fault["ranks"]
        root = report.root_causes[0]
        assert root.kind == fault["kind"]
        if fault["kind"] != "missing_dump":
            assert root.collective_seq_id == fault["collective_seq_id"]
            assert root.process_group.desc == fault["process_group_desc"]
    else:
        assert report.verdict == "healthy", report.summary
        assert not any(report.culprits.values()), report.culprits


def test_per_host_folders_name_the_host():
    report = _analyze("subgroups_per_host")
    truth = expected("subgroups_per_host")
    assert report.culprits["hosts"] == [h for h, ranks in truth["hosts"].items() if 5 in ranks] == ["node1"]
    # the groups flightrec inferred from the Gloo dumps are the ones the job created
    groups = report.trace.groups
    for name, g in truth["groups"].items():
        row = groups.filter(groups["pg_name"] == name)
        assert (row["pg_desc"][0], row["ranks"][0].to_list()) == (g["desc"], g["ranks"])


@pytest.mark.parametrize("case", ["healthy_json", "skip_collective_json"])
def test_json_fixtures_match_their_pickle_twins(case):
    twin = case.removesuffix("_json")
    assert _analyze(case).culprits == _analyze(twin).culprits


@pytest.mark.parametrize("case", recorded_cases())
def test_cli_json_and_exit_code(case):
    result = CliRunner().invoke(main, ["analyze", str(FIXTURES / case), "--format", "json", "--quiet"])
    data = json.loads(result.stdout)
    assert result.exit_code == {"healthy": 0, "fault": 1, "inconclusive": 3}[data["verdict"]]
    fault = expected(case)["fault"] or {}
    assert data["verdict"] == ("inconclusive" if fault.get("indistinguishable_from") or fault.get("needs_world_size")
                               else
                               "fault" if _has_root_cause(fault) else "healthy")


def test_golden_reports_are_current():
    assert golden.main(["--check"]) == 0


# Each golden without an expected answer, and the test that checks its verdict on its own (a golden alone would
# only say the report did not change, not that it is right)
CHECKED_WITHOUT_EXPECTED = {
    "healthy_json": "test_json_fixtures_match_their_pickle_twins",
    "skip_collective_json": "test_json_fixtures_match_their_pickle_twins",
    "writer_sharing": "test_the_writer_sharing_pair_is_a_healthy_snapshot",
}


def test_every_golden_is_paired_with_an_independent_check():
    without = [c for c in golden.cases() if not (FIXTURES / c / "expected.json").exists()]
    assert sorted(without) == sorted(CHECKED_WITHOUT_EXPECTED), without
    for test in set(CHECKED_WITHOUT_EXPECTED.values()):
        assert test in globals(), test


def test_the_writer_sharing_pair_is_a_healthy_snapshot():
    """Two healthy ranks dumped while a collective was in flight on both (what the writer shares, recorded):
    nothing wrong, and nothing says whether the job hung."""
    report = _analyze("writer_sharing")
    assert report.verdict == "healthy" and not report.root_causes
    assert [f.kind for f in report.findings] == ["in_flight_at_dump"]


def test_gloo_sends_and_receives_are_not_collectives_a_rank_is_missing():
    """Gloo records no entry for a send or receive, yet counts it in pg_status's enqueued counter: in
    straggler_pipeline the default group reads 122 enqueued against its 42 recorded collectives (80 sends and
    receives). Progress is the newest entry, so nobody looks 80 collectives ahead of what the dumps show and the
    timing window still holds the default group's collectives."""
    report = _analyze("straggler_pipeline")
    status = report.trace.pg_status.filter(pl.col("pg_id") == 0)
    assert set(status["last_enqueued"].to_list()) == {122}
    prog = report.matching.progress.filter(pl.col("group") == "0")
    assert set(prog["last_enqueued"].to_list()) == {42} and set(prog["behind"].to_list()) == {0}
    assert report.timing.lateness.filter(pl.col("group") == "0").height > 0


@pytest.mark.parametrize("case", ROLLED)
def test_rolled_past_rank_5_has_no_entry_of_the_group_only_its_pg_status(case):
    """The premise of the rolled_past_* fixtures, read through flightrec's loader: rank 5's ring buffer holds none
    of the group it stopped joining, every peer's newest entry there is the collective it skipped, and rank 5's
    pg_status, at that group's local id, says how far it got."""
    fault = expected(case)["fault"]
    report = _analyze(case)
    entries = report.trace.entries
    of_group = entries.filter(pl.col("pg_name").cast(pl.String) == fault["process_group_name"])
    assert of_group.filter(pl.col("rank") == 5).height == 0
    assert entries.filter(pl.col("rank") == 5).height == expected(case)["buffer_size"]
    newest = of_group.group_by("rank").agg(pl.col("collective_seq_id").max())
    assert dict(newest.iter_rows()) == {r: fault["collective_seq_id"] for r in fault["process_group_ranks"] if r != 5}
    status = report.trace.pg_status.filter(
        (pl.col("rank") == 5) & (pl.col("pg_id") == int(fault["rolled_out"]["pg_status_key"])))
    assert status["last_enqueued"].to_list() == [fault["collective_seq_id"] - 1]


@pytest.mark.parametrize("case", ROLLED)
def test_rolled_past_the_matcher_reads_how_far_rank_5_got_from_pg_status(case):
    """`_rolled_out_status` (match.py): with no entry of the group left, rank 5's progress there is its pg_status
    counter (first_seq is null: no entry), one behind its peers. Without that path it would be unknown (null)."""
    fault = expected(case)["fault"]
    report = _analyze(case)
    prog = report.matching.progress.filter(pl.col("group").cast(pl.String) == fault["process_group_name"])
    assert sorted(prog["rank"].to_list()) == fault["process_group_ranks"]
    row = prog.filter(pl.col("rank") == 5).row(0, named=True)
    assert (row["first_seq"], row["last_enqueued"], row["behind"]) == (None, fault["collective_seq_id"] - 1, 1)


@pytest.mark.parametrize("case", ROLLED)
def test_rolled_past_rank_5_is_named_from_its_pg_status(case):
    """Rank 5 is the root cause: it never joined the group's collective its peers hang in. Its dump has no entry
    of that group, so only pg_status can have placed it there."""
    fault = expected(case)["fault"]
    report = _analyze(case)
    assert report.culprits["ranks"] == [5] and report.culprits["hosts"] == ["node1"]
    root = report.root_causes[0]
    assert (root.kind, root.ranks, root.collective_seq_id) == ("not_joined", [5], fault["collective_seq_id"])
    assert (root.process_group.name, root.process_group.desc) == (fault["process_group_name"],
                                                                  fault["process_group_desc"])
    prog = report.matching.progress.filter((pl.col("group").cast(pl.String) == fault["process_group_name"])
                                           & (pl.col("rank") == 5))
    assert prog["first_seq"].to_list() == [None] and prog["last_enqueued"].to_list() == [fault["collective_seq_id"] - 1]
    # (and the finding says where that came from: nothing in rank 5's dump shows it)
    assert root.evidence["last_seq_from_pg_status"] == {"5": fault["collective_seq_id"] - 1}


def test_order_swap_names_rank_6_the_rank_that_broke_the_order():
    """order_swap: from step 2 rank 6 runs the grad-norm all_reduce on default_pg before its dp all_reduce, every
    other rank after it. Rank 2 waits in dp for rank 6; rank 6, with the six others, waits in default_pg for rank
    2: a wait cycle, nothing skipped, nothing rolled out. The dumps show the swap (rank 6's newest default_pg entry
    is one ahead of rank 2's, its newest dp entry one behind) and every other rank recorded dp #k before default_pg
    #k+1, so rank 6 is the odd one out (cycles.py): not_joined in its dp group at the dp seq it ran late."""
    fault = expected("order_swap")["fault"]
    swap = fault["swap"]
    report = _analyze("order_swap")
    entries = report.trace.entries.with_columns(pl.col("pg_desc").cast(pl.String))
    newest = {(r, d): q for r, d, q in entries.group_by("rank", "pg_desc").agg(pl.col("collective_seq_id").max())
              .iter_rows()}
    assert (newest[(6, "default_pg")], newest[(6, "dp")]) == (swap["newest_seq"]["default_pg"],
                                                             swap["newest_seq"]["dp"]) == (4, 2)
    assert (newest[(2, "default_pg")], newest[(2, "dp")]) == (swap["partner_newest_seq"]["default_pg"],
                                                             swap["partner_newest_seq"]["dp"]) == (3, 3)
    # everyone else: dp #3 recorded before default_pg #4; rank 6 recorded default_pg #4 and no dp #3
    at = {(r, d): rid for r, d, rid in entries.filter(
        ((pl.col("pg_desc") == "dp") & (pl.col("collective_seq_id") == 3))
        | ((pl.col("pg_desc") == "default_pg") & (pl.col("collective_seq_id") == 4))
    ).select("rank", "pg_desc", "record_id").iter_rows()}
    assert all(at[(r, "dp")] < at[(r, "default_pg")] for r in (0, 1, 3, 4, 5, 7))
    assert (6, "dp") not in at and (2, "default_pg") not in at and (6, "default_pg") in at
    # nothing rolled out: every rank's entries start at record 0
    assert set(entries.group_by("rank").agg(pl.col("record_id").min())["record_id"].to_list()) == {0}

    assert report.verdict == "fault"
    assert report.culprits["ranks"] == [6] and report.culprits["hosts"] == ["node1"]
    root = report.root_causes[0]
    assert (root.kind, root.ranks, root.collective_seq_id) == ("not_joined", [6], fault["collective_seq_id"]) \
        == ("not_joined", [6], 3)
    assert (root.process_group.name, root.process_group.desc) == (fault["process_group_name"], "dp") == ("5", "dp")
    assert sorted(root.evidence["deadlock"]["ranks"]) == fault["deadlock"]["ranks"] == [2, 6]
    assert sorted(root.evidence["deadlock"]["groups"]) == sorted(fault["deadlock"]["groups"]) == ["0", "5"]


def test_a_junk_file_named_past_the_declared_world_adds_no_ranks(tmp_path):
    """A non-dump named like rank 6 beside the four real Gloo dumps of skip_collective: refused, and the world
    stays the four ranks their config declares; it made ranks 4-6 read as missing and hid rank 2."""
    import shutil

    job = tmp_path / "job"
    shutil.copytree(FIXTURES / "skip_collective", job)
    (job / "nccl_trace_rank_6").write_text("not a dump at all")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(job, use_cache=False)
    assert report.trace.world_size == 4 and report.dumps.refused
    assert report.culprits["ranks"] == expected("skip_collective")["fault"]["ranks"] == [2]


@pytest.mark.parametrize("case", ["healthy", "skip_collective"])
def test_a_world_size_larger_than_the_dumps_declare_is_warned_about_and_blames_no_shape(case):
    """--world-size 5 on four Gloo ranks: every all_gather's output is 4x its input, which broke the op's rule
    for a group of 5 on every member ("ranks 0-3 used shape ... where the other 0 members ...")."""
    with pytest.warns(UserWarning, match="declares a world of 4 ranks: rank 4 will read as missing"):
        report = analyze(FIXTURES / case, world_size=5, use_cache=False)
    assert not [f for f in report.findings if f.kind == "mismatch"]


@pytest.mark.parametrize("damage", ["removed", "cut short"])
def test_a_bystanders_missing_dump_does_not_hide_the_rank_that_skipped(tmp_path, damage):
    """skip_collective (rank 2 skips all_reduce #8) with rank 1's dump gone or cut to 80%: 'rank 1 left no
    dump, and 3 ranks wait on it', rank 2 counted among them. Rank 2 is behind and its pg_status says all it
    enqueued finished: idle, not waiting; ranks 0 and 3 completed #7, so rank 1 joined it."""
    import shutil

    job = tmp_path / "job"
    shutil.copytree(FIXTURES / "skip_collective", job)
    victim = job / "nccl_trace_rank_1"
    if damage == "removed":
        victim.unlink()
    else:
        victim.write_bytes(victim.read_bytes()[: int(victim.stat().st_size * 0.8)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(job, use_cache=False)
    roots = [f for f in report.findings if f.role == "root_cause"]
    assert report.culprits["ranks"] == [2] and roots[0].kind == "not_joined", report.to_text()
