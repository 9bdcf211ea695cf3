"""Names from a stranger's model file: no code from them ever runs, and any name Caffe or Torch7
accepts converts to the same function as a plainly named copy of the net."""

from __future__ import annotations

import ast
import json
import keyword
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from convert.api import convert
from convert.naming import MODULE_ATTRS, Names, inert, printable
from convert.torch7.t7file import TorchObject
from convert.torch7.t7write import dump
from convert.torch_emit import import_model
from zoo.cli import app

ROOT = Path(__file__).resolve().parents[1]


def payload(canary: Path) -> list[str]:
    """Texts that would run code (touch ``canary``) if pasted into generated source."""
    cmd = f"__import__('os').system('touch {canary}')"
    return [f'n"""\n{cmd}\n"""', f"c\n    {cmd}", f"x'); {cmd}; ('", f"\\\n{cmd}", f"# \r{cmd}",
            f"\u2028{cmd}", f"{{{cmd}}}", f"[/x]\x1b[2J{cmd}\x00"]


def quoted(text: str) -> str:
    """A prototxt string literal holding ``text`` exactly."""
    esc = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\x00": "\\000", "\x1b": "\\033"}
    return '"' + "".join(esc.get(ch, ch) for ch in text) + '"'


def net(names: dict[str, str], net_name: str = "plain") -> str:
    """A small net exercising convolution, in-place ReLU, a blob consumed twice, Eltwise, Concat,
    InnerProduct; every layer and blob name comes from ``names`` (keyed by its plain name)."""
    n = lambda k: quoted(names.get(k, k))  # noqa: E731
    return f"""name: {quoted(net_name)}
input: {n('data')} input_dim: 2 input_dim: 3 input_dim: 9 input_dim: 9
layer {{ name: {n('conv1')} type: "Convolution" bottom: {n('data')} top: {n('c1')}
  convolution_param {{ num_output: 4 kernel_size: 3 }} }}
layer {{ name: {n('relu1')} type: "ReLU" bottom: {n('c1')} top: {n('c1')} }}
layer {{ name: {n('conv2')} type: "Convolution" bottom: {n('data')} top: {n('c2')}
  convolution_param {{ num_output: 4 kernel_size: 3 }} }}
layer {{ name: {n('sum')} type: "Eltwise" bottom: {n('c1')} bottom: {n('c2')} top: {n('s')} }}
layer {{ name: {n('cat')} type: "Concat" bottom: {n('s')} bottom: {n('c2')} top: {n('cat')} }}
layer {{ name: {n('sig')} type: "Sigmoid" bottom: {n('cat')} top: {n('cat')} }}
layer {{ name: {n('fc')} type: "InnerProduct" bottom: {n('cat')} top: {n('fc')}
  inner_product_param {{ num_output: 5 }} }}
"""


PLAIN = ["data", "conv1", "c1", "relu1", "conv2", "c2", "sum", "s", "cat", "sig", "fc"]


def outputs(art: Path, x: np.ndarray) -> np.ndarray:
    mod = import_model(art / "model.py")
    with torch.no_grad():
        return mod.load()(torch.from_numpy(x)).numpy()


def same_function(tmp_path: Path, names: dict[str, str]) -> None:
    """``names`` give a net that converts, verifies, and computes what the plainly named one does."""
    (tmp_path / "plain.prototxt").write_text(net({}))
    (tmp_path / "odd.prototxt").write_text(net(names), encoding="utf-8")
    a = convert(tmp_path / "plain.prototxt", out=tmp_path / "out")
    b = convert(tmp_path / "odd.prototxt", out=tmp_path / "out")
    assert b.report["status"] == "verified", b.report["verification"]
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype(np.float32)
    np.testing.assert_array_equal(outputs(a.dir, x), outputs(b.dir, x))
    assert json.loads((b.dir / "convert.json").read_text())["inputs"] == {names.get("data", "data") or "input": [2, 3, 9, 9]}


def test_every_layer_named_like_a_module_attribute(tmp_path: Path) -> None:
    attrs = ["forward", "training", "eval", "state_dict", "to", "cuda", "_modules", "__init__", "self",
             "F", "torch", "nn", "math", "load", "Net", "input", "pool2d"]
    same_function(tmp_path, dict(zip(PLAIN, attrs)))


def test_names_that_are_not_identifiers(tmp_path: Path) -> None:
    # fi and its ligature are one identifier after NFKC normalisation: they must stay two values
    odd = ["x²", "ｆｕｌｌ", "fi", "ﬁ", "1st", "class", "a b", "é", "ß", "--", "名前"]
    same_function(tmp_path, dict(zip(PLAIN, odd)))


def test_names_that_collide_with_invented_ones(tmp_path: Path) -> None:
    # the frontend calls earlier in-place versions of c1 "c1@1"; ONNX initializers are "conv1.weight"
    names = {"data": "data", "c1": "c1", "c2": "c1@1", "s": "conv1.weight", "cat": "c1@2",
             "fc": "conv1/Gemm_3", "sum": "conv1"}
    same_function(tmp_path, names)


def test_empty_names(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same_function(tmp_path / "a", {"data": "", "conv1": "", "relu1": "", "sum": ""})
    same_function(tmp_path / "b", {"c2": "", "sig": "", "relu1": ""})  # a top may be "" too


def test_layer_names_repeated(tmp_path: Path) -> None:
    same_function(tmp_path, {k: "same" for k in ("conv1", "relu1", "conv2", "sum", "cat", "sig", "fc")})


def test_hostile_names_run_no_code(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    texts = payload(canary)
    names = dict(zip(PLAIN, texts + [t + "2" for t in texts]))
    src = tmp_path / "model.prototxt"
    src.write_text(net(names, net_name=texts[0]), encoding="utf-8")
    runner = CliRunner()
    r = runner.invoke(app, ["convert", str(src), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["verify", str(tmp_path / "out" / "model")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["info", str(src)])
    assert r.exit_code == 0, r.output
    source = (tmp_path / "out" / "model" / "model.py").read_text()
    ast.parse(source)
    assert "\x1b" not in r.output and not canary.exists()
    outputs(tmp_path / "out" / "model", np.zeros((2, 3, 9, 9), np.float32))
    assert not canary.exists()


def test_hostile_file_names_run_no_code(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    for i, text in enumerate(payload(canary)):
        stem = f"m{i}" + text.replace("/", "_").replace("\x00", "")
        src = tmp_path / f"{stem}.prototxt"
        src.write_text(net({}, net_name=text))
        r = CliRunner().invoke(app, ["convert", str(src), "--out", str(tmp_path / "out"), "--no-verify"])
        assert r.exit_code in (0, 2), r.output  # 2: a folder name zoo will not create
        for py in (tmp_path / "out").glob("*/model.py"):
            ast.parse(py.read_text())
            import_model(py)
    assert not canary.exists()


def test_hostile_bench_runs_no_code(tmp_path: Path) -> None:
    """zoo bench converts, verifies and times in child processes: none of them runs the payload."""
    canary = tmp_path / "CANARY"
    texts = payload(canary)
    src = tmp_path / "evil.prototxt"
    src.write_text(net(dict(zip(PLAIN, texts + [t + "2" for t in texts])), net_name=texts[1]), encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "zoo.cli", "bench", str(src), "--runtime", "torch",
                        "--runtime", "onnxruntime", "--budget", "20", "--out", str(tmp_path / "r.json")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {r["status"] for r in rows} == {"ok"} and not canary.exists()


def test_hostile_lua_and_t7_names_run_no_code(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    for i, text in enumerate(payload(canary)[:4]):
        lua = tmp_path / f"d{i}{text.replace('/', '_')}.lua"
        lua.write_text("local m = nn.Sequential()\nm:add(nn.SpatialConvolution(3, 4, 3, 3))\n"
                       "m:add(nn.ReLU())\nreturn m\n")
        r = CliRunner().invoke(app, ["convert", str(lua), "--out", str(tmp_path / "out"),
                                     "--input-shape", "input=1,3,8,8"])
        assert r.exit_code in (0, 2), r.output
        t7 = tmp_path / f"t{i}.t7"
        dump(TorchObject(f"nn.{text}", {"train": False}, 1), t7)
        r = CliRunner().invoke(app, ["convert", str(t7), "--out", str(tmp_path / "out"),
                                     "--input-shape", "input=1,3,8,8"])
        assert r.exit_code == 2 and "unsupported" in r.output, r.output
        assert "\x1b" not in r.output
    assert any((tmp_path / "out").glob("*/model.py")) and not canary.exists()


def test_markup_in_messages_is_printed_as_text(tmp_path: Path) -> None:
    src = tmp_path / "m.prototxt"
    src.write_text('input: "d[/x]" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8\n'
                   'layer { name: "[red]c[/red]" type: "Nope[/y]" bottom: "d[/x]" top: "c" }\n')
    p = subprocess.run([sys.executable, "-m", "zoo.cli", "convert", str(src), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "Nope[/y]" in p.stderr and "[red]c[/red]" in p.stderr and len(p.stderr.strip().splitlines()) == 1


# --- the naming functions themselves ------------------------------------------------------------

def test_module_attrs_cover_the_installed_torch() -> None:
    public = {n for n in dir(torch.nn.Module) if not n.startswith("_")}
    public |= {n for n in vars(torch.nn.Module()) if not n.startswith("_")}
    assert public <= MODULE_ATTRS, sorted(public - MODULE_ATTRS)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=12))
def test_names_are_fresh_ascii_identifiers(raw: list[str]) -> None:
    names = Names({"self", "torch"})
    got = [names.get(r) for r in raw]
    assert len(set(got)) == len(got)
    for g in got:
        assert g.isidentifier() and g.isascii() and not keyword.iskeyword(g)
        assert g not in ("self", "torch") and not g.startswith("_")


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_inert_text_stays_inside_comments_and_docstrings(text: str) -> None:
    src = f'"""{inert(text, 400)}"""\n# {inert(text)}\nX = 1\n'
    tree = ast.parse(src)
    assert ast.literal_eval(tree.body[0].value) == text  # the docstring holds the text, nothing else
    assert len(tree.body) == 2 and "\n" not in inert(text)


@given(st.text(max_size=100))
def test_printable_has_no_control_characters(text: str) -> None:
    assert all(ch.isprintable() or ch == " " for ch in printable(text))
