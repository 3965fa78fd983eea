"""The scenarios are written for the cluster `cluster up` started: one node, except
test_two_nodes.py, which skips itself unless there are two. On two nodes every other file is
skipped, naming why: their DaemonSets would run a pod on each node where they count one, and
their workloads could land on either."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.cluster.topology import recorded

HERE = Path(__file__).resolve().parent
TWO_NODE_FILES = {"test_two_nodes.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    count = recorded().count
    if count == 1:
        return
    skip = pytest.mark.skip(
        reason=f"a one-node scenario; the cluster has {count} nodes (run/nodes)"
    )
    for item in items:
        # the hook sees the whole session's items, not only this folder's
        if item.path.is_relative_to(HERE) and item.path.name not in TWO_NODE_FILES:
            item.add_marker(skip)
