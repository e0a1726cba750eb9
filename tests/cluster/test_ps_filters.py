"""`ps` on a cluster (issue 26): the filters and the order go to every live node,
each filters its own rows, and the node asked merges them in the order asked for.
Three real nodes, one real PostgreSQL."""

from __future__ import annotations

from tests.e2e.harness import Daemon

SPEC = 'name = "{name}"\nagent = "{agent}"\nlabels = {{ team = "{team}" }}\n'


def _make(d: Daemon, name: str, agent: str, team: str) -> None:
    spec = d.write_spec(name, SPEC.format(name=name, agent=agent, team=team))
    d.ctl("create", str(spec), check=True)


def test_ps_filters_pass_to_every_node(three: list[Daemon]) -> None:
    n1, n2, n3 = three
    _make(n1, "a1", "red", "x")
    _make(n1, "b1", "blue", "y")
    _make(n2, "a2", "red", "y")
    _make(n2, "b2", "blue", "x")
    n2.ctl("suspend", "b2", check=True)
    for d in three:
        rows = d.json("ps")
        assert [r["name"] for r in rows] == ["b1", "b2", "a1", "a2"]  # by agent, then name
        assert {r["name"]: r["node"] for r in rows} == {"a1": "n1", "b1": "n1", "a2": "n2",
                                                       "b2": "n2"}  # fmt: skip
    assert [r["name"] for r in n3.json("ps", "--agent", "red")] == ["a1", "a2"]
    assert [r["name"] for r in n3.json("ps", "--label", "team=x")] == ["b2", "a1"]
    assert [r["name"] for r in n1.json("ps", "--state", "suspended")] == ["b2"]
    assert next(r["name"] for r in n3.json("ps", "--sort", "state")) == "b2"
    table = n3.ctl("ps", "--agent", "nobody", check=True).stdout
    assert table.strip() == "no sessions match"
