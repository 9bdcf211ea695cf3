"""Nothing is lost: output folder names that point elsewhere, folders zoo did not write, results files
of another run, concurrent writers, stale temporaries of killed runs, orphaned children, full or
read-only disks, the user's umask."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bench import results
from bench.cases import PROTOCOLS
from bench.results import KEY, Recorder, ResultsError
from convert import artifacts, isolate
from convert.api import convert
from convert.errors import ConvertError
from zoo.cli import app

TESTS = Path(__file__).parent
ROOT = TESTS.parent
NET = '''input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
'''


def _others(out: Path) -> dict[str, str]:
    """Files of someone else's in the --out folder."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "notes.txt").write_text("mine")
    (out / "other-model").mkdir(exist_ok=True)
    (out / "other-model" / "data.bin").write_text("precious")
    return {"notes.txt": "mine", "other-model/data.bin": "precious"}


def _intact(out: Path, files: dict[str, str]) -> bool:
    return all((out / k).is_file() and (out / k).read_text() == v for k, v in files.items())


@pytest.mark.parametrize("filename", ["..prototxt", ".prototxt", "...prototxt"])
def test_dot_stems_never_replace_the_out_folder(tmp_path: Path, filename: str) -> None:
    src = tmp_path / "models" / filename
    src.parent.mkdir()
    src.write_text(NET)
    out = tmp_path / "out"
    files = _others(out)
    r = CliRunner().invoke(app, ["convert", str(src), "--out", str(out)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert _intact(out, files)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "other-model"]


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/abs", "a\0b", ".hidden", "-rf", "x" * 181])
def test_bad_output_folder_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConvertError, match="cannot name an output folder"):
        artifacts.destination(tmp_path, name)


@pytest.mark.parametrize("name", ["alexnet", "a.b", "x²", "ﬁ", "a b", "x" * 180])
def test_good_output_folder_names(tmp_path: Path, name: str) -> None:
    assert artifacts.destination(tmp_path, name) == tmp_path / name


def test_an_existing_folder_zoo_did_not_write_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "small.prototxt"
    src.write_text(NET)
    out = tmp_path / "out"
    (out / "small").mkdir(parents=True)
    (out / "small" / "thesis.tex").write_text("years of work")
    with pytest.raises(ConvertError, match="small exists and is not a zoo model folder; choose another --out"):
        convert(src, out=out)
    assert (out / "small" / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in out.iterdir()) == ["small"]  # no temporary left either


def test_an_existing_file_link_or_empty_folder_is_refused_a_zoo_folder_replaced(tmp_path: Path) -> None:
    src = tmp_path / "small.prototxt"
    src.write_text(NET)
    out = tmp_path / "out"
    out.mkdir()
    (out / "small").write_text("a file")
    with pytest.raises(ConvertError, match="is not a zoo model folder"):
        convert(src, out=out, check=False)
    (out / "small").unlink()
    (tmp_path / "elsewhere").mkdir()
    (out / "small").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConvertError, match="is not a zoo model folder"):
        convert(src, out=out, check=False)
    (out / "small").unlink()
    (out / "small").mkdir()  # perhaps a mount point: not zoo's
    with pytest.raises(ConvertError, match="is not a zoo model folder"):
        convert(src, out=out, check=False)
    (out / "small").rmdir()
    first = convert(src, out=out, check=False)
    assert (first.dir / "convert.json").is_file()
    assert convert(src, out=out, check=False).dir == out / "small"  # zoo's own folder: replaced
    assert sorted(p.name for p in out.iterdir()) == ["small"]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path: Path) -> None:
    src = tmp_path / "small.prototxt"
    src.write_text(NET)
    out = tmp_path / "out"
    out.mkdir()
    dead, live, host = _dead_pid(), os.getpid(), isolate.HOST
    names = {
        f".small.zoo-tmp-{host}-{dead}-abc123": False,  # removed
        f".other.zoo-old-{host}-{dead}-0f0f": False,
        f".small.zoo-tmp-{host}-{live}-abc123": True,  # a live process's: kept
        f".small.zoo-tmp-elsewhere-{dead}-abc123": True,  # another machine's (a shared folder): kept
        f".small.old-{dead}": True,  # not zoo's pattern: never touched
        ".git": True,
        f"zoo-tmp-{host}-{dead}-x.txt": True,  # a file, not a folder zoo made
    }
    for n in names:
        if n.endswith(".txt"):
            (out / n).write_text("")
        else:
            (out / n).mkdir()
            (out / n / "model.onnx").write_bytes(b"\0" * 100)
    convert(src, out=out, check=False)
    for n, kept in names.items():
        assert (out / n).exists() == kept, n
    assert (out / "small" / "convert.json").is_file()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie nobody reaped (pid 1 of a container may not)


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d.name))
        except (OSError, IndexError, ValueError):
            pass
    return kids


def sleep_forever(feeds: dict[str, np.ndarray], marker: str) -> dict[str, np.ndarray]:
    """Run by convert.isolate in the child: says it is running, then sleeps."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(3600)
    return feeds


ISO_PARENT = """
import sys
import numpy as np
from convert import isolate
isolate.call("test_data_safety:sleep_forever", {"x": np.zeros(1)}, marker=sys.argv[1])
"""
WORKER_PARENT = """
from bench.cases import Case
from bench.timing import Policy
from bench.worker import isolated
policy = Policy(warmup_iters=1, warmup_s=0, min_iters=3, min_s=0, max_iters=5, max_s=1).__dict__
case = Case(model="m", source_format="caffe", artifact="", runtime="test-hang", device="cpu", precision="fp32",
            layout="nchw", batch=1, mode="inference", protocol="zoo", threads=1, input_shapes={"x": [1, 2]},
            output_shapes=[[1, 2]], policy=policy)
isolated({**case.to_dict(), "plugin": "fake_runtimes"}, 3600)
"""


def _wait(cond, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(cond())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
@pytest.mark.parametrize("script", [ISO_PARENT, WORKER_PARENT], ids=["isolate", "bench-worker"])
def test_children_die_with_their_parent(script: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    marker = tmp_path / "started"
    parent = subprocess.Popen([sys.executable, "-c", script, str(marker)], env=env, cwd=ROOT)
    try:
        assert _wait(lambda: _children(parent.pid), 60), "the child never started"
        kids = _children(parent.pid)
        if script is ISO_PARENT:
            assert _wait(marker.exists, 60), "the isolated function never ran"
        else:  # the worker imports torch, then hangs in its first forward
            time.sleep(3.0)
        assert not any(_gone(k) for k in kids), "the child ended on its own: nothing tested"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    _wait(lambda: all(_gone(k) for k in kids), 10)
    left = [k for k in kids if not _gone(k)]
    for k in left:
        os.kill(k, signal.SIGKILL)
    assert not left, "a child outlived its killed parent"


def _row(i: int, who: str = "a") -> dict[str, object]:
    return {**dict.fromkeys(KEY, who), "batch": i + 1, "status": "skipped", "reason": "test"}


def test_concurrent_writers_keep_every_row(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    Recorder(path, {"threads": 1})
    errors = []

    def writer(who: str) -> None:
        try:
            rec = Recorder(path, {}, resume=True)
            for i in range(25):
                rec.add(_row(i, who))
        except Exception as e:  # noqa: BLE001 - reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    rows = results.read(path)["rows"]
    assert len(rows) == 75 and {r["model"] for r in rows} == set("abc")
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left


def test_concurrent_writer_processes_keep_every_row(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    Recorder(path, {})
    code = ("import sys; from bench.results import Recorder, KEY\n"
            "rec = Recorder(sys.argv[1], {}, resume=True)\n"
            "for i in range(20):\n"
            "    rec.add({**dict.fromkeys(KEY, sys.argv[2]), 'batch': i + 1, 'status': 'skipped', 'reason': 'r'})\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), w], env=env) for w in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert len(results.read(path)["rows"]) == 40


def test_a_new_recorder_never_takes_over_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    rec = Recorder(path, {})
    rec.add(_row(0))
    with pytest.raises(ResultsError, match="exists: continue it with --resume, or choose another --out"):
        Recorder(path, {})
    assert len(results.read(path)["rows"]) == 1


def test_bench_out_existing_is_refused_without_resume(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.prototxt").write_text(NET)
    old = tmp_path / "old.json"
    Recorder(old, {}).add(_row(0))
    before = old.read_bytes()
    r = CliRunner().invoke(app, ["bench", "tiny.prototxt", "--runtime", "torch", "--out", str(old)])
    assert r.exit_code == 2 and "--resume" in r.output and "Traceback" not in r.output, r.output
    assert old.read_bytes() == before
    assert not (tmp_path / "outputs").exists()  # refused before converting anything


def test_an_unwritable_results_path_is_refused_before_the_sweep(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.prototxt").write_text(NET)
    (tmp_path / "file").write_text("")  # a folder under a regular file: unwritable even for root
    r = CliRunner().invoke(app, ["bench", "tiny.prototxt", "--runtime", "torch",
                                 "--out", str(tmp_path / "file" / "sub" / "r.json")])
    assert r.exit_code == 2 and "cannot write results there" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_a_read_only_or_full_disk_is_found_by_the_probe(tmp_path: Path, monkeypatch, code: int) -> None:  # type: ignore[no-untyped-def]
    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(results.tempfile, "mkstemp", refuse)
    with pytest.raises(ResultsError, match=f"cannot write results there: {os.strerror(code)}"):
        results.check_writable(tmp_path / "r.json")


def test_the_probe_leaves_nothing(tmp_path: Path) -> None:
    results.check_writable(tmp_path / "a" / "r.json")
    assert list((tmp_path / "a").iterdir()) == []
    (tmp_path / "d.json").mkdir()
    with pytest.raises(ResultsError, match="is a directory"):
        results.check_writable(tmp_path / "d.json")


def test_a_full_disk_during_the_sweep_says_which_rows_were_kept_where(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.json"
    rec = Recorder(path, {})
    rec.add(_row(0))
    rec.add(_row(1))

    def full(doc, f):  # type: ignore[no-untyped-def]
        f.write('{"partial":')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results, "_dump", full)
    with pytest.raises(ResultsError) as e:
        rec.add(_row(2))
    msg = str(e.value)
    assert "\n" not in msg and "No space left on device" in msg and f"2 row(s) saved before are kept in {path}" in msg
    assert "--resume" in msg
    monkeypatch.undo()
    assert len(results.read(path)["rows"]) == 2  # the file is whole
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_full_disk_in_the_cli_is_one_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from zoo import bench_cli

    def full(*a, **k):  # type: ignore[no-untyped-def]
        raise ResultsError("r.json: cannot save the row of m: No space left on device; 2 row(s) saved before ...")

    monkeypatch.setattr(bench_cli.sweep, "run", full)
    monkeypatch.setattr(bench_cli.interleaved, "run", full)
    monkeypatch.setattr(bench_cli, "_peaks", lambda *a, **k: {})
    monkeypatch.setattr(bench_cli.benchmark, "plan", lambda *a, **k: bench_cli.benchmark.Plan(PROTOCOLS["zoo"], 0))
    r = CliRunner().invoke(app, ["bench", "alexnet", "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "No space left on device" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_results_files_follow_the_umask(tmp_path: Path, mask: int, mode: int) -> None:
    old = os.umask(mask)
    try:
        Recorder(tmp_path / "r.json", {}).add(_row(0))
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == mode


def test_a_results_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    rec = Recorder(path, {})
    path.chmod(0o600)
    rec.add(_row(0))
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["rows"][0]["batch"] == 1


def test_stale_isolation_folders_are_removed(tmp_path: Path) -> None:
    dead, host = _dead_pid(), isolate.HOST
    for n in (f"zoo-iso-{host}-{dead}-k2j4", f"zoo-iso-{host}-{os.getpid()}-k2j4", "zoo-iso-abc", "pytest-of-root"):
        (tmp_path / n).mkdir()
    assert isolate.clean_stale(tmp_path) == [tmp_path / f"zoo-iso-{host}-{dead}-k2j4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"zoo-iso-{host}-{os.getpid()}-k2j4", "zoo-iso-abc", "pytest-of-root"])


def test_the_default_results_path_is_always_a_new_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from zoo import benchmark

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(benchmark.time, "strftime", lambda fmt: "20260101-000000")
    env = {"cpu": "Test CPU", "cores_physical": 2}
    first = benchmark.default_results_path(env)
    Recorder(first, env)
    second = benchmark.default_results_path(env)
    assert second != first and second.name == "20260101-000000-2.json" and not second.exists()


def test_a_model_moved_aside_by_a_killed_run_is_put_back(tmp_path: Path) -> None:
    """Killed between moving the old model aside and moving the new one in: the next run restores it."""
    out = tmp_path / "out"
    aside = out / f".small.zoo-old-{isolate.HOST}-{_dead_pid()}-0f0f"
    aside.mkdir(parents=True)
    (aside / "convert.json").write_text('{"zoo_version": "0"}')
    isolate.clean_stale(out)
    assert (out / "small" / "convert.json").is_file() and not aside.exists()


def test_bench_never_removes_a_folder_it_did_not_write(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without --keep, zoo bench removes what it converted, in a folder of its own; a folder of the user's
    where the model would go is left as it was."""
    from zoo import benchmark

    monkeypatch.chdir(tmp_path)
    (tmp_path / "small.prototxt").write_text(NET)
    mine = tmp_path / "outputs" / "cache" / "small-1x3x8x8"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    p = benchmark.plan(["small.prototxt"], runtimes=["torch"], precisions=["fp32"], layouts=["nchw"], batches=[1])
    case = p.live(p.cases[0])
    p.release()
    assert case.status == "" and Path(case.artifact) != mine
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert [p.name for p in mine.parent.iterdir()] == ["small-1x3x8x8"]


def test_bench_refuses_two_models_of_one_name(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rows and plans are keyed by model name: a/net and b/net would overwrite each other's."""
    monkeypatch.chdir(tmp_path)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "net.prototxt").write_text(NET)
    r = CliRunner().invoke(app, ["bench", "a/net.prototxt", "b/net.prototxt", "--runtime", "torch", "--dry-run"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "two models named 'net': a/net.prototxt and b/net.prototxt" in r.output
    assert len(r.output.strip().splitlines()) == 1
    one = CliRunner().invoke(app, ["bench", "a/net.prototxt", "--runtime", "torch", "--dry-run"])
    r = CliRunner().invoke(app, ["bench", "a/net.prototxt", "./a/net.prototxt", "--runtime", "torch", "--dry-run"])
    assert r.exit_code == 0 and r.output.count(" net ") == one.output.count(" net ") > 0, r.output


def test_bench_does_not_take_a_folded_conversion_for_its_own(tmp_path: Path) -> None:
    from zoo import benchmark

    src = tmp_path / "small.prototxt"
    src.write_text(NET)
    plain, folded = (convert(src, out=tmp_path / d, fold=f).dir for d, f in (("plain", False), ("folded", True)))
    shapes = {"data": [1, 3, 8, 8]}
    assert json.loads((folded / "convert.json").read_text())["fold"] is True
    assert benchmark._fresh(plain, src, shapes, 0) is not None
    assert benchmark._fresh(folded, src, shapes, 0) is None
