"""``python -m streamstate_cli state-api`` serves the state query API on its own (uvicorn), OpenAPI included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from runtime.process import free_port
from runtime.settings import PROJECT_ROOT


def test_state_api_runs_on_its_own(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "STREAMSTATE_DATA_DIR": str(tmp_path),
        "STREAMSTATE_STATE_API_PORT": str(port),
        "STREAMSTATE_STATE_API_TOKEN": "tok-123",
    }
    log = open(tmp_path / "api.log", "w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "streamstate_cli", "state-api"],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/openapi.json", headers={"Authorization": "Bearer tok-123"}
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    spec = json.loads(resp.read())
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, open(tmp_path / "api.log").read()
                time.sleep(0.3)
        assert (
            spec["info"]["title"] == "streamstate state queries"
            and "/jobs/{job}/stores/{store}/keys/{key}" in spec["paths"]
        )
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs", timeout=5)
            raise AssertionError("answered without the token")
        except urllib.error.HTTPError as err:
            assert err.code == 401
    finally:
        server.terminate()
        server.wait(30)
    assert "tok-123" not in open(tmp_path / "api.log").read()  # the token is never logged
