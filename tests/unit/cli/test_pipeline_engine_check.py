"""An unreachable Docker engine stops `infermatrix pipeline` before any step (issue 47): exit 4
as README says (not 1), one line naming the endpoint, and the journal untouched (a tagged cell
is never turned into "failed at base"). The endpoint is a socket path where nothing listens."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.paths import REPO, TESTS

CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"


def test_an_unreachable_engine_exits_4_before_any_step_and_leaves_the_journal(tmp_path):
    state = tmp_path / "state"
    record = state / "journal" / f"{CELL}.json"
    record.parent.mkdir(parents=True)
    tagged = {"cell": CELL, "stages": {"tag": {"status": "pass"}, "publish": {"status": "pass"}}}
    record.write_text(json.dumps(tagged))
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"}
    env.pop("DOCKER_CONTEXT", None)
    done = subprocess.run(
        [sys.executable, "-m", "infermatrix", "pipeline", "--offline", "--matrix",
         str(TESTS / "matrix" / "matrix.yaml"), "--state-dir", str(state), "--select", CELL],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 4, done.stderr[-2000:]
    assert "cannot reach the Docker engine" in done.stderr
    assert json.loads(record.read_text()) == tagged
    assert [p.name for p in record.parent.iterdir()] == [record.name]
