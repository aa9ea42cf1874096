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
