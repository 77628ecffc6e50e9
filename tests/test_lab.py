"""`make lab`'s command line (scripts/lab.sh): JupyterLab on 127.0.0.1 behind a token, serving the notebooks, and
starting as root too (containers, cloud notebook VMs), where Jupyter refuses to run without --allow-root."""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO

LAB = REPO / "scripts" / "lab.sh"
JUPYTER = Path(sys.executable).with_name("jupyter")


def _shim(tmp_path: Path, uid: int) -> dict:
    """PATH with an `id` that reports this uid, and a JUPYTER that prints the arguments it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_dir / "jupyter").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "JUPYTER": str(bin_dir / "jupyter")}


@pytest.mark.parametrize("uid", [0, 1000])
def test_lab_command_line_binds_loopback_and_allows_root_only_for_root(tmp_path, uid):
    r = subprocess.run(["bash", str(LAB), "--port=9999"], env=_shim(tmp_path, uid), capture_output=True, text=True,
                       timeout=60, check=True)
    args = r.stdout.splitlines()
    assert args[:3] == ["lab", "--ip=127.0.0.1", "--no-browser"] and args[-1] == "--port=9999"
    assert f"--ServerApp.root_dir={REPO / 'notebooks'}" in args
    assert ("--allow-root" in args) == (uid == 0)
    assert ("passing --allow-root" in r.stderr) == (uid == 0)


def test_lab_refuses_an_empty_token(tmp_path):
    env = {**_shim(tmp_path, 1000), "JUPYTER_TOKEN": ""}
    r = subprocess.run(["bash", str(LAB)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and "JUPYTER_TOKEN is set but empty" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def _drain(lines: queue.Queue, seen: list[str]) -> str:
    while not lines.empty():
        seen.append(lines.get_nowait())
    return "".join(seen)


def test_lab_serves_the_notebooks_on_loopback_with_a_token(tmp_path):
    pytest.importorskip("jupyterlab", reason="JupyterLab is in the `notebooks` extra: pip install -e '.[notebooks]'")
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, "JUPYTER": str(JUPYTER), "JUPYTER_TOKEN": token,
           # keep the server's runtime files and the user's Jupyter config out of this test
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.Popen(["bash", str(LAB), f"--port={port}", "--ServerApp.port_retries=0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        # ready = the first HTTP answer (Jupyter prints its URL a moment before it accepts connections), polled
        # with a bounded deadline while the server's output is collected; a server that exits fails at once
        deadline, status, body = time.monotonic() + 120, None, b""
        while status is None:
            assert proc.poll() is None, f"jupyter lab exited {proc.returncode}:\n{_drain(lines, seen)}"
            assert time.monotonic() < deadline, f"no HTTP answer in 120 s:\n{_drain(lines, seen)}"
            try:
                status, body = _get(f"http://127.0.0.1:{port}/api/contents", token)
            except urllib.error.URLError:  # not listening yet
                try:
                    seen.append(lines.get(timeout=0.25))
                except queue.Empty:
                    pass
        _drain(lines, seen)
        if os.geteuid() == 0:
            assert any("passing --allow-root" in line for line in seen)
        assert status == 200, "".join(seen)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert "01_quickstart.ipynb" in names and {p.name for p in (REPO / "notebooks").glob("*.ipynb")} <= names
        assert _get(f"http://127.0.0.1:{port}/api/contents", None)[0] == 403  # the token is required
    finally:
        proc.send_signal(signal.SIGTERM)  # the script exec'd jupyter: this pid is the server
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
