"""The cluster's network namespace: a holder's namespace is joined only once the holder has
left the caller's (until `unshare` has run, /proc/PID/ns/net is still the caller's, and a
node set up there would be set up in the host's); a holder that exits first is an error;
and this test process runs in a namespace of its own making, as conftest arranged."""

from __future__ import annotations

import os
import subprocess

import pytest
from kubeinfer.cluster import netns


def test_the_holders_namespace_is_taken_only_after_it_left_ours() -> None:
    # The holder leaves our namespace only after a pause, as a slow unshare would.
    holder = subprocess.Popen(["sh", "-c", "sleep 0.5; exec unshare --net -- sleep 30"])
    try:
        assert os.stat(netns.namespace_of(holder.pid)).st_ino == netns.current_namespace_inode()
        path = netns.wait_for_own_namespace(holder.pid)
        assert os.stat(path).st_ino != netns.current_namespace_inode()
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_that_exits_before_leaving_is_an_error() -> None:
    holder = subprocess.Popen(["true"])
    holder.wait()
    with pytest.raises(netns.NamespaceError, match="exited"):
        netns.wait_for_own_namespace(holder.pid, timeout_seconds=2)


def test_this_test_process_left_the_hosts_namespace() -> None:
    host = netns.host_namespace()
    assert host is not None
    assert os.fstat(host).st_ino != netns.current_namespace_inode()
    netns.check_made_here()


def test_emptying_a_namespace_ends_a_process_that_joins_it_late() -> None:
    # A host-network pod's container that a shim was still starting when `cluster down`
    # swept the namespace joins it after the first look: the sweep watches until the
    # namespace has stayed empty a while.
    from kubeinfer.cluster import teardown

    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "30"])
    late: list[subprocess.Popen[bytes]] = []
    namespace = os.open(netns.wait_for_own_namespace(holder.pid), os.O_RDONLY)
    try:
        inode = os.fstat(namespace).st_ino
        # Joins through the descriptor (the holder is gone by then), 0.3 s after the sweep began.
        joiner = ["sh", "-c", f"sleep 0.3; exec nsenter --net=/proc/self/fd/{namespace} sleep 30"]
        late.append(subprocess.Popen(joiner, pass_fds=(namespace,)))
        assert teardown.empty_namespace(inode, settle_seconds=1.0) == set()
        assert teardown.processes_in_namespace(inode) == set()
        assert late[0].wait(timeout=5) is not None
        assert holder.wait(timeout=5) is not None
    finally:
        os.close(namespace)
        for process in (holder, *late):
            process.kill()
            process.wait()
