"""zoo bench on a real local Ray cluster (ray.cluster_utils.Cluster: simulated nodes carrying the
custom resources ``accelerator_type:fakeA`` and ``fakeB``, standing in for two accelerator types),
with the fake runtimes of tests/fake_runtimes.py. Marked ``ray``: they run only inside a
loopback-only network namespace (see conftest.ray_netns), as .ci/run does."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import fake_runtimes  # noqa: F401  (registers the fakes in every process that unpickles a FakeCase)
import numpy as np
import pytest
from typer.testing import CliRunner

from bench import cluster, results, sweep
from bench.cases import Case
from bench.results import Recorder
from bench.timing import Policy
from zoo.cli import app

TESTS = Path(__file__).parent
POLICY = Policy(warmup_iters=1, warmup_s=0, min_iters=3, min_s=0, max_iters=5, max_s=1).__dict__


@dataclass
class FakeCase(Case):
    plugin: str = "fake_runtimes"  # the worker process imports it (bench.worker.open_case)


def fake_cases(art: str, ref: str, batches: tuple[int, ...] = (1,)) -> list[Case]:
    out: list[Case] = []
    for b in batches:
        for rt, mode in (("test-sleep", "inference"), ("test-sleep", "training"), ("test-async", "inference")):
            out.append(FakeCase(model="m", source_format="caffe", artifact=art, runtime=rt, device="cpu",
                                precision="fp32", layout="nchw", batch=b, mode=mode, protocol="zoo", threads=1,
                                input_shapes={"x": [b, 2]}, output_shapes=[[b, 2]], policy=POLICY, reference=ref))
    return out


def write_artifact(d: Path) -> tuple[str, str]:
    """A converted model's files as far as the cluster looks at them, and its float64 reference
    (the fakes output zeros: verification passes with error 0)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "ir.json").write_text('{"graph": "the same on every node"}')
    np.savez(d / "ref.npz", o0=np.zeros((1, 2)))
    return str(d), str(d / "ref.npz")


def fake_prepare(threads: int | None, *, root: str, batches: tuple[int, ...] = (1,)) -> list[Case]:
    """What a node builds: its own copy of the artifact (under its node id), the cases."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return fake_cases(*write_artifact(Path(root) / node / "m-1x2"), batches)


@pytest.fixture(scope="module")
def ray_cluster(ray_netns, tmp_path_factory):  # type: ignore[no-untyped-def]
    from ray.cluster_utils import Cluster

    # the nodes' workers (and their case processes) import this module and the fakes
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), *([old] if old else [])])
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"accelerator_type:fakeA": 1}})
    c.add_node(num_cpus=1, resources={"accelerator_type:fakeB": 1})
    try:
        yield c
    finally:
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def by_fake_accelerator(node: cluster.Node, device: str = "cpu", machine_of=cluster.machine_of) -> str:  # type: ignore[no-untyped-def]
    """The fake accelerator types stand in for GPU types: their nodes are named as CUDA nodes would be
    (the fake cases themselves run on the CPU, which would name both nodes after this host's CPU)."""
    return machine_of(node, "cuda:0")


def sweep_on(c, prepare, out: Path, run_id: str, *, accelerators=(), resume=False, progress=None):  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as mp, cluster.session(c.address) as ray:
        mp.setattr(cluster, "machine_of", by_fake_accelerator)
        nodes = cluster.select(ray, list(accelerators), False)
        nodes = cluster.set_up(ray, nodes, prepare, threads=None, gpu=None, device="cpu", isolate=True)
        recs = cluster.recorders(nodes, out, run_id, resume)
        rows = cluster.run(ray, nodes, recs, isolate=True, timeout_s=60, progress=progress)
    return nodes, recs, rows


@pytest.fixture(scope="module")
def first_run(ray_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("cluster")
    prepare = lambda threads: fake_prepare(threads, root=str(tmp / "nodes"))  # noqa: E731
    return tmp, prepare, *sweep_on(ray_cluster, prepare, tmp / "results", "run1")


def _view(rows):  # type: ignore[no-untyped-def]
    return sorted((results.key(r), r["status"], r.get("verification")) for r in rows)


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_each_accelerator_times_the_serial_case_set_with_the_same_verification(first_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tmp, _, nodes, recs, rows = first_run
    art, ref = write_artifact(tmp_path / "m-1x2")
    serial = sweep.run(fake_cases(art, ref), Recorder(tmp_path / "serial.json", {}), isolate=False)
    assert {r["status"] for r in serial} == {"ok"}  # timed and verified against the reference
    assert sorted(recs) == ["fakea", "fakeb"]
    for m, rec in recs.items():
        saved = results.read(rec.path)["rows"]
        assert _view(saved) == _view(rows[m]) == _view(serial)
        assert rec.path == tmp / "results" / m / "run1.json"


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_each_node_rows_carry_its_own_environment_and_gemm_peak(first_run) -> None:  # type: ignore[no-untyped-def]
    _, _, nodes, recs, _ = first_run
    by_id = {n.id: n for n in nodes}
    for m, rec in recs.items():
        doc = results.read(rec.path)
        for row in doc["rows"]:
            node = by_id[row["node"]["id"]]
            env = doc["env"]["nodes"][node.id]
            assert node.machine == m and env == node.env
            assert f"accelerator_type:fake{m[-1].upper()}" in env["ray_node"]["resources"]
            assert env["gemm_peak"]["cpu"]["fp32"]["tflops"] > 0
            assert node.cases[results.key(row)].gemm_peak_tflops == env["gemm_peak"]["cpu"]["fp32"]["tflops"]
    assert len({n.id for n in nodes}) == 2


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_resume_skips_finished_cases(first_run, ray_cluster) -> None:  # type: ignore[no-untyped-def]
    tmp, prepare, _, recs, _ = first_run
    path = recs["fakeb"].path
    doc = results.read(path)
    dropped = doc["rows"].pop(1)  # as if the sweep had stopped before this case
    results.write(path, doc)
    _, recs2, rows = sweep_on(ray_cluster, prepare, tmp / "results", "run1", accelerators=["fakeB"], resume=True)
    assert [results.key(r) for r in rows["fakeb"]] == [results.key(dropped)]
    assert len(results.read(path)["rows"]) == 3


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_a_node_lost_mid_sweep_loses_no_finished_row(ray_cluster, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    extra = ray_cluster.add_node(num_cpus=1, resources={"accelerator_type:fakeA": 1})
    prepare = lambda threads: fake_prepare(threads, root=str(tmp_path / "nodes"), batches=(1, 2))  # noqa: E731
    killed: list[str] = []
    victim = extra.node_id[:8]

    def kill_when_busy(s: cluster.State) -> None:  # the extra node has finished a case and runs another
        for label, done, running, _ in s.nodes:
            if victim in label and done >= 1 and running and not killed:
                killed.append(label)
                ray_cluster.remove_node(extra)

    with caplog.at_level(logging.WARNING):
        _, recs, rows = sweep_on(ray_cluster, prepare, tmp_path, "run2", accelerators=["fakeA"],
                                 progress=kill_when_busy)
    assert killed and any("lost" in r.message for r in caplog.records)
    saved = results.read(recs["fakea"].path)["rows"]
    assert len(saved) == 6 and {r["status"] for r in saved} == {"ok"}  # every case, once, timed
    by_node = {r["node"]["id"][:8] for r in saved}
    assert victim in by_node and len(by_node) == 2  # the lost node's finished rows are kept


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_convert_jobs_as_ray_tasks(ray_cluster) -> None:  # type: ignore[no-untyped-def]
    from test_parallel_convert import child_budget, child_fails

    from convert import limits
    from zoo.parallel import Failed, map_jobs

    got = list(map_jobs(child_budget, [0, 1, 2], cluster=ray_cluster.address))
    assert got == [str(limits.memory_budget())] * 3  # each in a fresh process, one per CPU of its node
    assert list(map_jobs(child_fails, [0], cluster=ray_cluster.address)) == [Failed("refused in the child")]


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_a_cluster_tasks_convert_error_is_its_one_line(ray_cluster) -> None:  # type: ignore[no-untyped-def]
    from test_parallel_convert import child_dies

    from convert import limits
    from zoo.parallel import map_jobs

    with pytest.raises(limits.ConvertError) as e:
        list(map_jobs(child_dies, ["x"], cluster=ray_cluster.address))
    assert str(e.value).startswith("x: its process died") and "\n" not in str(e.value)
    assert "RayTaskError" not in str(e.value)


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_zoo_convert_cluster_resolves_files_and_out_on_the_driver(ray_cluster, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from test_parallel_convert import NET

    from zoo.catalogue import ROOT

    src = ROOT / "outputs" / "tmp" / f"test-cluster-{os.getpid()}"  # a model file inside the checkout
    src.mkdir(parents=True)
    try:
        (src / "tiny.prototxt").write_text(NET.format(n=4))
        monkeypatch.chdir(src)  # relative paths: resolved here, not in the folder Ray's workers start in
        r = CliRunner().invoke(app, ["convert", "tiny.prototxt", "--out", os.path.relpath(tmp_path / "o"),
                                     "--cluster", ray_cluster.address])
    finally:
        shutil.rmtree(src)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "o" / "tiny" / "model.onnx").is_file() and "tiny: verified" in r.output


def kills_its_ray_worker(_: object) -> None:
    os.kill(os.getppid(), 9)  # the Ray worker running the task: Ray's own failure, not zoo's


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_a_ray_failure_in_zoo_convert_cluster_is_one_line(ray_cluster) -> None:  # type: ignore[no-untyped-def]
    from convert import limits
    from zoo.parallel import map_jobs

    with pytest.raises(limits.ConvertError, match="^--cluster: ") as e:
        list(map_jobs(kills_its_ray_worker, [0], cluster=ray_cluster.address))
    assert "\n" not in str(e.value)


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_cluster_local_starts_its_own_instance_whatever_ray_address_says(ray_cluster, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    with cluster.session("local") as ray:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        assert len(nodes) == 1 and not any(k.startswith("accelerator_type:fake") for k in nodes[0]["Resources"])


def test_machine_is_the_accelerator_only_for_cuda_cases() -> None:
    n = cluster.Node("n1", 4, "NVIDIA-H200", env={"cpu": "Some CPU 9000", "cores_physical": 4})
    assert cluster.machine_of(n, "cuda:0") == "h200"
    assert cluster.machine_of(n, "cpu") == cluster.benv.machine_name(n.env) != "h200"


class _FakeRay:
    def __init__(self, nodes: list[dict]) -> None:  # type: ignore[type-arg]
        self._nodes = nodes
        self.options: list[dict] = []  # type: ignore[type-arg]

    def nodes(self) -> list[dict]:  # type: ignore[type-arg]
        return self._nodes

    def remote(self, fn):  # type: ignore[no-untyped-def]
        fake = self

        class Remote:
            def options(self, **kw):  # type: ignore[no-untyped-def]
                fake.options.append(kw)
                return self
        return Remote()


def test_gpu_tasks_reserve_their_nodes_gpus(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("ray")
    monkeypatch.setattr(cluster, "_REMOTE", {})  # not the real Ray's remote functions of other tests
    ray = _FakeRay([{"NodeID": "a" * 56, "Alive": True, "Resources": {"CPU": 8, "GPU": 2, "accelerator_type:H200": 1}},
                    {"NodeID": "b" * 56, "Alive": True, "Resources": {"CPU": 4}}])
    nodes = cluster.select(ray, [], False, gpu=True)
    assert [(n.id[0], n.gpus) for n in nodes] == [("a", 2)]
    cluster._pinned(ray, cluster.run_on_node, nodes[0])
    assert ray.options[-1]["num_gpus"] == 2 and ray.options[-1]["num_cpus"] == 8
    cpu_only = cluster.select(ray, [], False)
    assert [n.gpus for n in cpu_only] == [0, 0]
    cluster._pinned(ray, cluster.run_on_node, cpu_only[0])
    assert ray.options[-1]["num_gpus"] == 0


def test_fingerprints_that_differ_refuse_that_node() -> None:
    nodes = [cluster.Node(str(i), 1, "fakeA", machine="fakea", fingerprints={"m-1x2": fp})
             for i, fp in enumerate(["aaa", "aaa", "bbb"])]
    cluster._agree(nodes)
    assert [n.refused for n in nodes] == [set(), set(), {"m-1x2"}]
    c = fake_cases("x/m-1x2", "")[0]
    k = results.key(c.to_dict())
    nodes[2].cases = {k: c}
    assert not nodes[2].may_run(k)


def test_cluster_without_ray_is_one_line(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as when it is not installed
    r = CliRunner().invoke(app, ["bench", "alexnet", "--cluster", "local", "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 2
    assert "pip install -e '.[cluster]'" in r.output and "Traceback" not in r.output
    assert not list(tmp_path.iterdir())  # nothing written


def test_report_sets_machines_side_by_side(tmp_path) -> None:  # type: ignore[no-untyped-def]
    art, ref = write_artifact(tmp_path / "m-1x2")
    for m, cpu in (("fakea", "CPU One"), ("fakeb", "CPU Two")):
        env = {"machine": m, "cpu": cpu, "threads": 1, "libraries": {"torch": "2.13.0"}}
        sweep.run(fake_cases(art, ref), Recorder(tmp_path / "results" / m / "run1.json", env), isolate=False)
    plots = tmp_path / "plots"
    r = CliRunner().invoke(app, ["report", str(tmp_path / "results"), "--plots", str(plots)])
    assert r.exit_code == 0, r.output
    section = r.output.split("## Machines side by side", 1)[1]
    head = next(ln for ln in section.splitlines() if ln.startswith("| model"))
    assert head.count("fakea test-") == 2 and head.count("fakeb test-") == 2  # machine x runtime
    assert "### fp32 · training · batch 1" in section and "F " in section and " / T " in section
    assert "fakea vs fakeb: CPU: CPU One vs CPU Two" in section
    assert list(plots.glob("machines-fp32-inference-*.png"))
    page = CliRunner().invoke(app, ["report", str(tmp_path / "results"), "--format", "html"])
    assert page.exit_code == 0 and "<h2>Machines side by side</h2>" in page.output and "fakeb test-sleep" in page.output
    single = CliRunner().invoke(app, ["report", str(tmp_path / "results" / "fakea")])
    assert single.exit_code == 0 and "Machines side by side" not in single.output


def test_cluster_model_files_must_be_in_the_checkout(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "ray", None)  # nothing here may start Ray
    net = tmp_path / "net.prototxt"
    net.write_text('input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8\n')
    r = CliRunner().invoke(app, ["bench", str(net), "--cluster", "local", "--out", str(tmp_path / "o" / "r.json")])
    assert r.exit_code == 2 and "must be inside the zoo checkout" in r.output
    assert not (tmp_path / "o").exists()


def test_a_tie_refuses_the_model_on_every_node(caplog) -> None:  # type: ignore[no-untyped-def]
    nodes = [cluster.Node(str(i), 1, "fakeA", machine="fakea", fingerprints={"m-1x2": fp, "n-1x2": "ccc"})
             for i, fp in enumerate(["aaa", "bbb"])]
    with caplog.at_level(logging.WARNING):
        cluster._agree(nodes)
    assert [n.refused for n in nodes] == [{"m-1x2"}, {"m-1x2"}]  # n-1x2 agrees
    assert any("no majority" in r.message and "m-1x2" in r.message for r in caplog.records)


def test_fingerprint_ignores_the_hosts_paths_not_the_conversion(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import onnx
    from test_parallel_convert import NET

    from convert.api import convert

    arts = []
    for host in ("host1/checkout", "host2/elsewhere/zoo"):  # two checkouts at different paths
        src = tmp_path / host / "net.prototxt"
        src.parent.mkdir(parents=True)
        src.write_text(NET.format(n=4))
        arts.append(convert(src, out=tmp_path / host / "out", name="net", check=False).dir)
    a, b = arts
    assert (a / "ir.json").read_text() != (b / "ir.json").read_text()  # meta.source differs
    assert (a / "model.py").read_text() != (b / "model.py").read_text()  # the header names the source
    assert cluster.artifact_fingerprint(a) == cluster.artifact_fingerprint(b)
    m = onnx.load(str(b / "model.onnx"))
    m.metadata_props.add(key="zoo.note", value="verified elsewhere")
    onnx.save(m, str(b / "model.onnx"))
    assert cluster.artifact_fingerprint(a) == cluster.artifact_fingerprint(b)  # metadata only
    m.graph.node[0].name = "an older converter's name"
    onnx.save(m, str(b / "model.onnx"))
    assert cluster.artifact_fingerprint(a) != cluster.artifact_fingerprint(b)  # an older cached ONNX
    shutil.copy(a / "model.onnx", b / "model.onnx")
    (b / "model.py").write_text((b / "model.py").read_text() + "\n# older code\n")
    assert cluster.artifact_fingerprint(a) != cluster.artifact_fingerprint(b)


def test_loopback_that_cannot_be_brought_up_is_a_reason_not_an_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ctypes
    import fcntl

    import conftest

    class Libc:
        def unshare(self, flags: int) -> int:  # as if the namespace were created (nothing is, here)
            return 0

    def ioctl(*a: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: Libc())
    monkeypatch.setattr(fcntl, "ioctl", ioctl)
    why = conftest.enter_loopback_namespace()
    assert why is not None and "cannot bring loopback up" in why


def test_cluster_refuses_what_it_would_ignore(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is needed
    for flags, named in ((["--rounds", "5"], "--rounds"), (["--concurrency", "2"], "--concurrency"),
                         (["--baseline", "torch", "--rounds", "4"], "--rounds, --baseline")):
        cmd = ["bench", "alexnet", "--cluster", "local", *flags, "--out", str(tmp_path / "r.json")]
        r = CliRunner().invoke(app, cmd)
        assert r.exit_code == 2 and f"{named} not available with --cluster" in r.output, r.output
        assert "Traceback" not in r.output
