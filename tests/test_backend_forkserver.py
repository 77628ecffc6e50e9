"""The local backend's fork server follows the preload list of the run that uses it (one server per process)."""

from __future__ import annotations

from multiprocessing import forkserver

from rlhfless.runtime.platform.backend import LocalBackend


def test_a_run_with_another_preload_list_gets_a_fork_server_that_imports_it():
    a, b = ["json"], ["json", "rlhfless.core.rundir"]
    LocalBackend("forkserver", a).boot()
    first = forkserver._forkserver._forkserver_pid
    LocalBackend("forkserver", a).boot()  # the same list: the running server is kept (no second boot)
    assert forkserver._forkserver._forkserver_pid == first
    LocalBackend("forkserver", b).boot()  # another list: a new server, booted with it
    assert forkserver._forkserver._forkserver_pid != first
    assert forkserver._forkserver._preload_modules == b
