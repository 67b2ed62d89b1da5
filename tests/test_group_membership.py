"""Members of undeclared (Gloo) groups: a rank whose ring buffer rolled the group out is placed from its
pg_status only where one group can hold it."""

import polars as pl

from flightrec.ingest.group_membership import inferred_groups, place_rolled_out_members
from flightrec.model.schema import GROUPS, conform

# tp {0,1} {2,3}, dp {0,2} {1,3}; local pg ids on every rank: 0 default, 1 tp, 2 dp. Rank 3's entries show only
# tp: its dp entries rolled out of its ring, and its pg_status still counts dp collectives (key 2).
ENTRIES = pl.DataFrame({
    "rank": [0, 0, 1, 1, 2, 2, 3],
    "pg_id": [1, 2, 1, 2, 1, 2, 1],
    "pg_name": ["1", "3", "1", "4", "2", "3", "2"],
    "pg_desc": ["tp", "dp", "tp", "dp", "tp", "dp", "tp"],
}).with_columns(pl.col("pg_name").cast(pl.Categorical))


def _status(ranks_keys):
    rows = [(r, k, 5, -1, 5) for r, keys in ranks_keys.items() for k in keys]
    return pl.DataFrame(rows, schema=["rank", "pg_id", "last_enqueued", "last_started", "last_completed"],
                        orient="row")


def _groups(entries=ENTRIES):
    declared = conform(pl.DataFrame(schema=GROUPS), GROUPS)
    return inferred_groups(entries, declared, world_size=4)


def _ranks(groups):
    return dict(groups.select(pl.col("group").cast(pl.String), "ranks").iter_rows())


def test_a_rank_whose_pg_status_counts_a_group_it_shows_no_entry_of_joins_the_one_short_group():
    groups = _groups()
    assert _ranks(groups)["4"] == [1]
    placed = place_rolled_out_members(groups, ENTRIES, _status({r: [0, 1, 2] for r in range(4)}), without_entries=[])
    assert _ranks(placed) == {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    assert placed.filter(pl.col("group") == "4")["size"].to_list() == [2]


def test_without_the_pg_status_key_nothing_is_placed():
    groups = _groups()
    status = _status({0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2], 3: [0, 1]})
    assert _ranks(place_rolled_out_members(groups, ENTRIES, status, without_entries=[])) == _ranks(groups)


def test_a_rank_without_entries_could_be_the_missing_member_so_nothing_is_placed():
    groups = _groups()
    status = _status({r: [0, 1, 2] for r in range(4)})
    assert _ranks(place_rolled_out_members(groups, ENTRIES, status, without_entries=[4])) == _ranks(groups)


def test_two_short_groups_of_the_kind_leave_the_ranks_unplaced():
    """Ranks 2 and 3 both rolled their dp entries out, beside a full dp group {4, 5}: groups 3 {0} and 4 {1}
    are both short, and which of ranks 2 and 3 goes where the entries can't say."""
    entries = pl.concat([
        ENTRIES.filter(~pl.col("rank").is_in([2, 3]) | (pl.col("pg_id") == 1)),
        pl.DataFrame({"rank": [4, 4, 5, 5], "pg_id": [1, 2, 1, 2], "pg_name": ["9", "5", "9", "5"],
                      "pg_desc": ["tp", "dp", "tp", "dp"]}).with_columns(pl.col("pg_name").cast(pl.Categorical)),
    ])
    groups = inferred_groups(entries, conform(pl.DataFrame(schema=GROUPS), GROUPS), world_size=6)
    assert _ranks(groups)["3"] == [0] and _ranks(groups)["4"] == [1]
    status = _status({r: [0, 1, 2] for r in range(6)})
    assert _ranks(place_rolled_out_members(groups, entries, status, without_entries=[])) == _ranks(groups)
