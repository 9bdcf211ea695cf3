"""``zoo clean``: only the named model's folders (not another model whose name starts the same), and
an unreadable --out is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoo.cli import app
from zoo.pipeline import is_variant


def _zoo_dir(d: Path) -> None:
    d.mkdir(parents=True)
    (d / "convert.json").write_text(json.dumps({"zoo_version": "0"}))


def test_a_name_matches_its_own_variants_only() -> None:
    assert is_variant("net", "net-1x3x8x8") and is_variant("net", "net-64x3x224x224-dropout-softmax")
    assert is_variant("net", "net-3x3")  # net itself at a 2-D input
    assert not is_variant("net", "net-3x3-1x3x8x8")  # model net-3x3's variant
    assert not is_variant("net", "net-3x3-1x3x8x8-dropout") and not is_variant("net", "net-lua-1x3x8x8")


def test_clean_leaves_another_models_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    models, cache = Path("outputs/models"), Path("outputs/cache")
    for d in (models / "net", models / "net-3x3", cache / "net-1x3x8x8", cache / "net-3x3-1x3x8x8"):
        _zoo_dir(d)
    r = CliRunner().invoke(app, ["clean", "net"])
    assert r.exit_code == 0, r.output
    assert "2 converted model folder(s) removed" in r.output
    assert sorted(p.name for p in models.iterdir()) == ["net-3x3"]
    assert sorted(p.name for p in cache.iterdir()) == ["net-3x3-1x3x8x8"]


def test_an_unreadable_out_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "models"
    _zoo_dir(out / "net")
    real = Path.iterdir

    def iterdir(self: Path):  # type: ignore[no-untyped-def]
        if self == out:  # as chmod 000 would (the tests may run as root, who reads anyway)
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    r = CliRunner().invoke(app, ["clean", "net", "--out", str(out)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{out}: cannot read: Permission denied" in r.output and (out / "net").is_dir()
