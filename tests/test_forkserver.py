"""The fork server (nanogpt/launch/forkserver.py) runs the sweep's main module once, itself:
its children skip it, and with it the entry point's imports (benchmarks/point_isolation.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A main module that notes each time it runs, then (as __main__) starts two children of the
# fork server. Without the server running it, each child would run it again as __mp_main__.
MAIN = """
import os, time
with open(os.environ["MARKS"], "a") as f:
    f.write(__name__ + "\\n")
if __name__ == "__main__":
    from nanogpt.launch import forkserver
    for _ in range(2):
        child = forkserver._server().Process(target=time.sleep, args=(0,))
        child.start()
        child.join()
        assert child.exitcode == 0
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux")
@pytest.mark.parametrize("how", ["script", "module"])
def test_the_fork_server_runs_the_main_module_once_for_all_its_children(tmp_path, how):
    (tmp_path / "sweep_main.py").write_text(MAIN)
    marks = tmp_path / "marks"
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    start = ["sweep_main.py"] if how == "script" else ["-m", "sweep_main"]
    proc = subprocess.run(
        [sys.executable, *start],
        cwd=tmp_path,
        env={**os.environ, "MARKS": str(marks), "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the sweep's process, then the server; the children ran nothing of it
    assert marks.read_text().split() == ["__main__", "__mp_main__"]
