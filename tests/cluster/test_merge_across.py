"""`sessionctl merge A --into B` where A and B run on different nodes: refused,
saying where each is and how to bring them together, and the way it names
works (docs/design.md section 10: any node's socket serves the whole cluster)."""

from __future__ import annotations

from tests.cluster.conftest import HELLO, taken_over
from tests.e2e.harness import Daemon, wait_event, wait_for


def test_a_merge_across_nodes_is_refused_with_what_to_do_and_works_once_they_share_one(
    three: list[Daemon],
) -> None:
    n1, n2, n3 = three
    n1.ctl("create", str(n1.write_spec("kid", HELLO.replace('"hello"', '"kid"'))), check=True)
    n2.ctl("create", str(n2.write_spec("mom", HELLO.replace('"hello"', '"mom"'))), check=True)
    refused = n3.ctl("merge", "kid", "--into", "mom")  # carried to kid's node, n1
    assert refused.returncode == 1, refused.stderr
    assert "runs on node n2" in refused.stderr
    assert "sessionctl migrate kid --node n2" in refused.stderr
    assert n3.json("show", "kid")["state"] != "terminated"  # nothing was done
    assert n2.json("log", "mom", "--type", "session.merged") == []

    n1.ctl("migrate", "kid", "--node", "n2", check=True)  # what the refusal said to do
    wait_for(lambda: taken_over([n2], "kid"), timeout=30, what="n2 to take kid")
    n3.ctl("merge", "kid", "--into", "mom", check=True)
    merged = wait_event(n2, "mom", "session.merged")
    assert merged["data"]["child"] == "kid"
    assert n1.json("show", "kid")["state"] == "terminated"
