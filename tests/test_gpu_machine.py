"""What a GPU loan needs before it starts: the suite collects its CUDA tests on a machine without
the optional packages (the GPU machines have no optuna, wandb, torchao or submitit:
../shared/device/README.md), and benchmarks/gpu_check.sh refuses a machine without CUDA in one
line and fits its parts in 9 minutes.

Real processes: pytest collecting the real suite in a fresh interpreter whose imports of those
packages fail as they do where they are not installed; the real script under bash.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from .conftest import REPO, compose_points

pytestmark = pytest.mark.slow

# Not installed on the GPU machines (../shared/device/README.md lists what is): the optional
# extras, W&B, the notebook's runners and pyarrow, which the image's list does not name.
ABSENT_THERE = (
    "optuna",
    "wandb",
    "wandb_workspaces",
    "torchao",
    "submitit",
    "hydra_plugins.hydra_submitit_launcher",
    "nbformat",
    "nbclient",
    "papermill",
    "pyarrow",
)

# pytest in an interpreter where importing any of ABSENT_THERE (or a submodule) raises
# ModuleNotFoundError, as on a machine without them; argv: pytest's arguments.
WITHOUT_THEM = """
import sys
from importlib.abc import MetaPathFinder

ABSENT = {absent!r}


class Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == a or name.startswith(a + ".") for a in ABSENT):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Absent())
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def test_the_cuda_tests_collect_without_the_packages_the_gpu_machines_lack():
    code = WITHOUT_THEM.format(absent=ABSENT_THERE)
    args = ["--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )
    out = proc.stdout + proc.stderr
    # A module that fails to import is a collection error: pytest then runs nothing at all.
    assert proc.returncode == 0 and "during collection" not in out, out[-3000:]
    collected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    # Every file that marks a test cuda has its tests collected (none skipped at import).
    marked = {
        f"tests/{path.name}"
        for path in (REPO / "tests").glob("test_*.py")
        if re.search(r"pytest\.mark\.cuda\b", path.read_text())
    }
    assert marked and marked <= collected, (marked - collected, out[-3000:])


GPU_CHECK = REPO / "benchmarks" / "gpu_check.sh"
GPU_SUMMARY = REPO / "benchmarks" / "gpu_summary.py"


def gpu_check(*args: str, tmp_path, **env_vars) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        **env_vars,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
    }
    return subprocess.run(
        ["bash", str(GPU_CHECK), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


# A part for each path the loan must judge (issues 50, 56), in the script's order before the
# unchanged parts move last: the GPU slot's first run, the CUDA tests, the CUDA-graph peak with its
# default-mode twin, the memory fit's depths, the README sweep, then what ran ok at 19e7a7f.
PATHS = (
    "muon",
    "cuda_tests",
    "reduce_overhead",
    "memory_fit",
    "readme_sweep",
    "chunked_loss",
    "user_model",
    "transformers",
    "fp8",
    "time_to_loss",
    "search",
)
LAST_OK = dict(re.findall(r"\[(\w+)\]=([0-9a-f]{7,40})\b", GPU_CHECK.read_text()))


def dry_run(tmp_path, **env) -> tuple[str, list, list[str], list[str], int]:
    """--dry-run's output, its rows (part, box, arithmetic, sum, margin), the dropped parts, the
    unchanged ones, and the total."""
    proc = gpu_check("--dry-run", tmp_path=tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # part, box, arithmetic, its sum: "muon  63 s  SWEEP + 2*MUON_POINT = 48 s, +30 % = 63 s; ..."
    rows = re.findall(r"^(\w+)\s+(\d+) s  (.+?) = (\d+) s, \+(\d+) % = \d+ s; ", out, flags=re.M)
    dropped = re.findall(r"^dropped: (\w+) ", out, flags=re.M)
    unchanged = re.findall(r"^unchanged: (\w+) ", out, flags=re.M)
    total = int(re.search(r"^total: (\d+) s", out, flags=re.M).group(1))
    return out, rows, dropped, unchanged, total


def test_gpu_check_dry_run_fits_one_loan_the_never_run_parts_and_the_tests_in_its_first_call(
    tmp_path,
):
    out, rows, dropped, unchanged, total = dry_run(tmp_path)
    constants = dict(re.findall(r"(\w+)=(\d+)", out.splitlines()[0]))
    margin = 30
    parts = [name for name, *_ in rows]
    assert parts[0] == "setup" and sorted(parts[1:] + dropped) == sorted(PATHS + ("default_gap",))
    for name, box, arithmetic, est, pct in rows:
        # the arithmetic, evaluated from the printed constants, is the sum printed, and the
        # box keeps at least 30 % over it
        assert eval(arithmetic, {}, {k: int(v) for k, v in constants.items()}) == int(est), name
        assert int(pct) >= margin and int(box) >= int(est) * (100 + margin) / 100, name
    grace = int(re.search(r"^each part after setup: \+(\d+) s", out, flags=re.M).group(1))
    assert total == sum(int(box) for _, box, *_ in rows) + grace * (len(rows) - 1)
    assert total <= 540
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    # The first call holds the CUDA tests and every part no GPU has run ok (no LAST_OK; the
    # default-gap benchmark is a figure, not a path), the GPU slot's first run among them
    never_run = set(PATHS) - set(LAST_OK)
    assert never_run == {"cuda_tests", "memory_fit"}
    assert never_run | {"muon", "reduce_overhead"} <= set(parts), parts
    assert "fsdp2" not in out  # one GPU a loan: FSDP2 is docs' unrun, not the loan's
    # Parts whose GPU code is their last ok loan's go after every part whose code changed
    order = parts[1:] + dropped
    changed = [p for p in order if p not in unchanged and p != "default_gap"]
    assert all(order.index(c) < order.index(u) for c in changed for u in unchanged), order
    assert order[-1] == "default_gap"
    # The second call: what the first dropped, the README sweep first of it, within 250 s
    command = re.search(r'^next call: GPU_CHECK_PARTS="([\w ]+)" bash', out, flags=re.M)
    assert command and command.group(1).split() == dropped
    second, rows2, still, _, total2 = dry_run(tmp_path, GPU_CHECK_PARTS=command.group(1))
    ran = [name for name, *_ in rows2]
    assert ran[:2] == ["setup", "readme_sweep"] and total2 <= 250, second
    assert sorted(ran[1:] + still) == sorted(dropped)
    if still:
        assert f'a later loan: GPU_CHECK_PARTS="{" ".join(still)}"' in second


def test_gpu_check_parts_names_a_missing_part_and_exits_2(tmp_path):
    proc = gpu_check("--dry-run", tmp_path=tmp_path, GPU_CHECK_PARTS="muon bogus")
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("gpu_check: GPU_CHECK_PARTS: no part bogus: setup muon cuda_tests")


def test_code_changed_reads_code_not_docstrings_and_refuses_an_unknown_commit(tmp_path):
    """benchmarks/code_changed.py, which orders the parts: against HEAD in a copy of a file
    whose docstring and comments changed, nothing; whose code changed, the path."""
    script = REPO / "benchmarks" / "code_changed.py"
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)

    git("init", "-q")
    (repo / "m.py").write_text('"""Old."""\n\n\ndef f():\n    """Old."""\n    return 1  # one\n')
    git("add", "m.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m")

    def run(*args):
        return subprocess.run(
            [sys.executable, str(script), *args], cwd=repo, capture_output=True, text=True
        )

    (repo / "m.py").write_text('"""New, true."""\n\n\ndef f():\n    return 1  # the one\n')
    assert run("HEAD", "m.py").stdout == ""
    (repo / "m.py").write_text('"""New."""\n\n\ndef f():\n    return 2\n')
    assert run("HEAD", "m.py").stdout == "m.py\n"
    refused = run("0000000", "m.py")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1


def prepared_tokens(into) -> str:
    """The token files `gpu_check.sh --prepare` writes into .gpu/ttl/, made by the script's own
    generator (its heredoc, run into `into`); returns train.bin's path. A clean clone (CI) has no
    .gpu/, so the time_to_loss part's data.path is pointed here: its points are then validated
    against the very file the loan reads (ids below model.vocab_size, long enough for a block)."""
    script = GPU_CHECK.read_text()
    found = re.search(r"\"\$PY\" - \.gpu/ttl <<'EOF'[^\n]*\n(.*?)\nEOF\n", script, flags=re.S)
    assert found, "gpu_check.sh --prepare no longer writes .gpu/ttl from a python heredoc"
    into.mkdir()
    subprocess.run([sys.executable, "-", str(into)], input=found.group(1), text=True, check=True)
    return str(into / "train.bin")


def test_every_sweep_part_of_the_gpu_check_composes_and_validates_for_a_cuda_machine(tmp_path):
    """Each sweep part's points, composed and checked as its multirun checks them before the
    first is measured (compose.check_points; here=False: this machine's devices are not asked), so
    a renamed key or a refused combination shows here, not on the loan. A data.path into .gpu/
    (there only after --prepare) is read from a copy --prepare's generator writes in tmp_path."""
    from hydra import initialize_config_dir

    from nanogpt.frontend.compose import check_points
    from nanogpt.frontend.presets import CONF_DIR, expand

    out = gpu_check("--dry-run", tmp_path=tmp_path).stdout
    parts = re.findall(r"^(\w+)\s+\d+ s  ", out, flags=re.M)
    parts += re.findall(r"^dropped: (\w+) ", out, flags=re.M)
    checked = []
    for part in parts:
        proc = gpu_check("--overrides", part, tmp_path=tmp_path)
        if part in (
            "setup",
            "cuda_tests",
            "default_gap",
        ):  # no sweep: a shell step, pytest, a script
            assert proc.returncode == 2 and "no sweep part" in proc.stderr
            continue
        assert proc.returncode == 0, (part, proc.stderr)
        overrides = proc.stdout.splitlines()
        assert "bench.device=cuda" in overrides
        prepared = os.path.realpath(REPO / ".gpu" / "ttl" / "train.bin")
        for i, override in enumerate(overrides):
            key, _, value = override.partition("=")
            if key == "data.path" and "/.gpu/" in value:
                assert os.path.realpath(value) == prepared, override  # what --prepare writes
                overrides[i] = f"data.path={prepared_tokens(tmp_path / 'ttl')}"
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            # raises ConfigError, naming the key (composed as the sweep's check composes)
            check_points(expand(overrides), None, False, compose_points())
        checked.append(part)
    assert set(PATHS) - {"cuda_tests"} <= set(checked)
    # the memory fit's compiled default-mode points, and reduce_overhead's twin beside its graphs
    fit = gpu_check("--overrides", "memory_fit", tmp_path=tmp_path).stdout.splitlines()
    assert {"model.n_layer=2,12", "perf.compile=true", "bench.diagnose=false"} <= set(fit)
    twin = gpu_check("--overrides", "reduce_overhead", tmp_path=tmp_path).stdout.splitlines()
    assert "perf.compile_mode=reduce-overhead,default" in twin


def test_a_sweep_without_pyarrow_writes_no_parquet_and_says_so_in_one_line(sweep, tmp_path):
    """The GPU image has no pyarrow and none travels: the table is still built and written
    (summary.csv, summary.md), the parquet files are not, and one line says why."""
    shadow = tmp_path / "no_pyarrow" / "pyarrow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no pyarrow on this machine')\n")
    proc, sweep_dir = sweep(
        "perf.batch_size=1", "bench.diagnose=false", env={"PYTHONPATH": str(shadow.parent)}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stdout.splitlines() if "parquet" in line]
    assert said == ["summary.parquet, steps.parquet: not written, no pyarrow (pip install pyarrow)"]
    assert (sweep_dir / "summary.csv").is_file() and (sweep_dir / "summary.md").is_file()
    assert not list(sweep_dir.glob("*.parquet"))


def test_docs_table_of_the_gpu_check_is_the_dry_runs(tmp_path):
    """docs/benchmarks.md's table of the check: the parts that run, their boxes and sums."""
    out = gpu_check("--dry-run", tmp_path=tmp_path).stdout
    ran = re.findall(r"^(\w+)\s+(\d+) s  .+? = (\d+) s,", out, flags=re.M)
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    section = docs[docs.index("### Checking on a GPU") :]
    table = re.findall(r"^\| `?(\w+)`? \| (\d+) s \| .+? = (\d+) \|", section, flags=re.M)
    assert table == ran
    total = re.search(r"^total: (\d+) s", out, flags=re.M).group(1)
    assert f"{total} s in all" in section


def load_gpu_summary():
    """benchmarks/gpu_summary.py as a module (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_summary", GPU_SUMMARY)
    module = sys.modules["gpu_summary"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_summary_flags_a_cuda_point_whose_path_left_its_figures_null():
    """The check's verdict on an ok CUDA point: the allocator's peaks and, compiled, torch's
    counters must come back; the estimate within 10 % of the CUDA peak. A record as a CUDA
    point's job writes it (results/record/), its figures set to what the flags judge."""
    from nanogpt.record import Record

    gpu_summary = load_gpu_summary()
    good = Record(status="ok")
    good.setup.device, good.asked.compile = "cuda:0", True
    good.memory.mem_peak_allocated_bytes = good.memory.mem_warmup_peak_allocated_bytes = 100
    good.rates.peak_memory_bytes, good.rates.peak_memory_from = 100, "cuda measured"
    good.setup.mem_estimate_bytes = 105
    good.compile.graph_breaks = 0
    assert gpu_summary.flags(good) == []
    bad = Record.from_dict({**good.to_dict(), "graph_breaks": None, "compile_note": "no counter"})
    bad.memory.mem_warmup_peak_allocated_bytes = None
    bad.setup.mem_estimate_bytes = 125
    assert gpu_summary.flags(bad) == [
        "a CUDA point without the allocator's peaks",
        "compiled, yet no compile counters (no counter)",
        "the estimate is +25.0 % off the peak (more than 10 %)",
    ]
    # a time-to-loss run trains to its target with no window: no window's peaks to miss (the
    # 2026-11-28 H200 flagged both of its runs before this)
    ttl = Record.from_dict({**good.to_dict(), "ttl_target_loss": 1.5})
    ttl.memory.mem_peak_allocated_bytes = ttl.memory.mem_warmup_peak_allocated_bytes = None
    assert gpu_summary.flags(ttl) == []
    bad.status = "oom"  # a failed point says so in its status: nothing more to flag
    assert gpu_summary.flags(bad) == []
    bad.status, bad.setup.device = "ok", "cpu"  # a CPU point has no allocator's peaks to judge
    assert gpu_summary.flags(bad) == []


def test_gpu_check_summary_gives_every_figure_a_value_or_the_reason_it_is_null(
    micro_sweep, tmp_path
):
    """--summary on a real CPU sweep: each point's block names every figure the loan judges,
    each with a value or the reason it is null; read through the record's schema
    (benchmarks/gpu_summary.py), so a renamed field stops it here."""
    gpu_summary = load_gpu_summary()
    _, sweep_dir = micro_sweep
    proc = gpu_check("--summary", str(sweep_dir), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    blocks = proc.stdout.split("### ")[1:]
    records = [p for p in sweep_dir.rglob("result.json") if "moved" not in p.parts]
    assert len(blocks) == len({p.parent for p in records} - {p.parent.parent for p in records})
    names = [figure.name for figure in gpu_summary.FIGURES]
    for block in blocks:
        rows = dict(
            (name, (value, why))
            for name, value, why in re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", block, re.M)
        )
        assert set(names) <= set(rows), block
        for name in names:
            value, why = rows[name]
            assert why.strip() and (value != "null" or "no reason recorded" not in why), (name, why)
    # On a CPU, the allocator's peaks are null and say why; the estimate is compared with no RSS
    assert (
        "| window's allocated peak | null | no CUDA caching allocator on device cpu |" in blocks[0]
    )
    assert "no CUDA allocator's peak on cpu, which the estimate models" in blocks[0]
    assert "| CUDA graphs' pool | null | no CUDA graphs (compile_mode default) |" in blocks[0]
    assert "| graph breaks | null | not compiled |" in blocks[0]
    assert all("\ncheck: ok\n" in block for block in blocks)  # a CPU point: nothing to flag
    assert re.search(r"\| optimizer implementation \| (foreach|for_loop)", blocks[0])
    # a bad dir: one line, exit 2
    bad = gpu_check("--summary", str(tmp_path / "none"), tmp_path=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="here it would run the whole check")
def test_gpu_check_without_cuda_says_so_in_one_line_and_exits_non_zero(tmp_path):
    proc = gpu_check(tmp_path=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("gpu_check: no CUDA here (torch ") and "sees no CUDA device" in line
    assert line.endswith("run it on a GPU machine (docs/benchmarks.md)")
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
