"""What `pip install jaxformer` puts on a machine: two top-level packages, the configs inside
the package, and a CLI that works from any directory."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # built from a copy of the source, so no stale build/ folder of the checkout leaks in
    src = tmp_path_factory.mktemp("src") / "jaxformer"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (path,) = glob.glob(str(out / "*.whl"))
    return zipfile.ZipFile(path)


def test_wheel_installs_two_top_level_packages(wheel):
    tops = {n.split("/")[0] for n in wheel.namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"jaxformer", "torch_ref"}


def test_wheel_ships_every_config(wheel):
    shipped = {os.path.basename(n) for n in wheel.namelist() if n.startswith("jaxformer/configs/")}
    in_repo = {f for f in os.listdir(os.path.join(ROOT, "jaxformer", "configs")) if f.endswith(".yaml")}
    assert in_repo and shipped == in_repo


def test_wheel_ships_the_pinned_corpus(wheel):
    from jaxformer.train.data import pinned
    shipped = {os.path.basename(n) for n in wheel.namelist() if n.startswith("jaxformer/train/data/embedded/")}
    assert shipped == {pinned.file_name(k) for k in pinned.PINNED}


def test_wheel_entry_point(wheel):
    (ep,) = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
    assert "jaxformer = jaxformer.cli:main" in wheel.read(ep).decode()


def _run(code_or_args, cwd):
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_no_generic_top_level_module(tmp_path):
    r = _run("import train", tmp_path)
    assert r.returncode != 0 and "No module named 'train'" in r.stderr


def test_cli_works_beside_a_users_train_py(tmp_path):
    (tmp_path / "train.py").write_text("raise SystemExit('the user script must not be imported')\n")
    r = _run(["-m", "jaxformer", "--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "train" in r.stdout and "parity" in r.stdout
    r = _run(["-m", "jaxformer", "--version"], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("jaxformer ")


def test_packaged_config_found_by_name_from_any_directory(tmp_path):
    code = ("from jaxformer.train.config import load_config, packaged_configs; "
            "c = load_config('lm'); print(c.model_name, sorted(packaged_configs()))")
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("lm ") and "'llama'" in r.stdout


def test_unknown_config_name_lists_the_packaged_ones(tmp_path):
    r = _run("from jaxformer.train.config import load_config; load_config('nope')", tmp_path)
    assert r.returncode != 0 and "not a packaged config" in r.stderr and "lm" in r.stderr


def test_atomic_writes_get_the_usual_modes(tmp_path):
    """Files and folders written atomically get the modes a plain open()/mkdir() would give."""
    from jaxformer import fileio
    mask = os.umask(0o022)
    try:
        fileio.write_text(str(tmp_path / "a.txt"), "x")
        with fileio.atomic_dir(str(tmp_path / "d")) as tmp:
            open(os.path.join(tmp, "f"), "w").close()
    finally:
        os.umask(mask)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


def test_cli_stderr_drops_only_background_loop_closed_tracebacks():
    """The CLI's stderr filter: main-thread text passes as written; from other threads, a
    traceback ending in "RuntimeError: Event loop is closed" is dropped whole even when
    threads interleave, and any other traceback or line passes."""
    import io
    import threading

    from jaxformer.cli import _BackgroundTracebackFilter
    out = io.StringIO()
    f = _BackgroundTracebackFilter(out)
    loop_closed = ["Traceback (most recent call last):\n", '  File "base_events.py", line 806, in x\n',
                   "    self._check_closed()\n", "RuntimeError: Event loop is closed\n"]
    other = ["Traceback (most recent call last):\n", '  File "w.py", line 1, in y\n', "ValueError: real\n"]
    barrier = threading.Barrier(2)

    def write(parts):
        barrier.wait()
        for p in parts:  # a line in two pieces, to interleave mid-line with the other thread
            f.write(p[:5])
            f.write(p[5:])
    threads = [threading.Thread(target=write, args=(loop_closed,)),
               threading.Thread(target=write, args=(other + ["a warning line\n"],))]
    f.write("main: kept\n")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = out.getvalue()
    assert "Event loop is closed" not in text and "_check_closed" not in text
    assert "main: kept\n" in text and "".join(other) in text and "a warning line\n" in text
