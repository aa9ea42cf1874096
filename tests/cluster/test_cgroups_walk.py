"""The teardown's walk of a cgroup tree while runc and the kubelet remove their own
directories in it (a node's teardown once stopped on such a directory, leaving the
cluster's processes running)."""

from __future__ import annotations

from pathlib import Path

from kubeinfer.cluster.cgroups import _directories


def test_a_directory_removed_during_the_walk_is_left_out(tmp_path: Path) -> None:
    pod = tmp_path / "kubepods" / "pod-a"
    (pod / "container").mkdir(parents=True)
    walk = _directories(tmp_path)
    assert [next(walk), next(walk), next(walk)] == [tmp_path, tmp_path / "kubepods", pod]
    (pod / "container").rmdir()
    pod.rmdir()  # gone before the walk lists it
    assert list(walk) == []
