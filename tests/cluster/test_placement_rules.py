"""Where a spec lets a session run (sessiond/cluster/placement.py): the rules
alone, on stored specs as the store's ``placement_for`` reads them; the
three-node tests are in test_placement.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.cluster.placement import placement_for, placement_of, waiting_reason
from sessiond.log.store.pg.placement import Placement
from sessiond.table.spec import BadSpec, SessionSpec, parse_spec, spec_to_toml

SHARED = [Path("/srv/shared")]


def stored(text: str, base: str = "/home/ann/docs") -> SessionSpec:
    """A spec as the daemon stores it (paths resolved from its folder), read back."""
    return parse_spec(spec_to_toml(parse_spec(text, base=Path(base))), base=Path("/"))


def test_the_store_records_what_the_parsed_stored_spec_asks_for() -> None:
    text = spec_to_toml(parse_spec('name = "a"\nnode = "n2"\n', base=Path("/home/ann")))
    assert placement_for("n1", SHARED)(text) == Placement("n2", {}, None, None)
    assert placement_for("n1", SHARED)(None) == Placement()
    assert placement_for("n1", SHARED)("not [ toml") == Placement()  # refused elsewhere


def test_a_workspace_outside_the_shared_paths_belongs_to_the_node_that_wrote_it() -> None:
    spec = stored('name = "a"\n[run]\nexec = ["true"]\n')
    assert placement_of(spec, here="n1", shared=SHARED) == Placement(
        None, {}, "/home/ann/docs", "n1"
    )
    shared = stored('name = "a"\n[run]\nexec = ["true"]\n', base="/srv/shared/docs")
    assert placement_of(shared, here="n1", shared=SHARED).workspace_node is None
    assert placement_of(shared, here="n1", shared=[]).workspace_node == "n1"


def test_no_workspace_fails_over_and_a_git_repo_outside_the_shared_paths_counts() -> None:
    assert placement_of(stored('name = "a"\n'), here="n1", shared=[]) == Placement()
    spec = stored(
        'name = "a"\n[run]\nexec = ["true"]\n[[trigger]]\ntype = "git"\nrepo = "/home/ann/repo"\n',
        base="/srv/shared/docs",
    )
    assert placement_of(spec, here="n2", shared=SHARED) == Placement(
        None, {}, "/home/ann/repo", "n2"
    )


def test_a_pin_and_labels_are_read_and_kept_through_the_stored_spec() -> None:
    spec = stored(
        'name = "a"\nnode = "n2"\nnode_labels = { gpu = "a100" }\n[run]\nexec = ["true"]\n',
        base="/srv/shared/x",
    )
    placed = placement_of(spec, here="n1", shared=SHARED)
    assert placed == Placement("n2", {"gpu": "a100"}, "/srv/shared/x", None)
    assert placed.refusal("n2", {"gpu": "a100", "zone": "eu"}) is None
    assert placed.refusal("n3", {"gpu": "a100"}) == (
        "it is pinned to node 'n2' (its spec says node = \"n2\")"
    )
    assert Placement(needs={"gpu": "a100", "zone": "eu"}).refusal("n2", {"zone": "eu"}) == (
        "node 'n2' lacks the labels it needs: gpu=a100 (it has zone=eu)"
    )
    assert waiting_reason(placed, "n2") == "waiting for node n2 (its spec pins it there)"
    assert waiting_reason(Placement(needs={"gpu": "a100"}), None) == (
        "waiting for a node with labels gpu=a100"
    )


def test_a_bad_node_name_in_a_spec_is_refused_naming_the_key() -> None:
    with pytest.raises(BadSpec, match="node"):
        parse_spec('name = "a"\nnode = "no spaces"\n', base=Path("/"))
