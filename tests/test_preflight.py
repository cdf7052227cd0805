"""The preflight: every newcomer mistake of issue 14 is reported before any asset runs, naming its
field, with exit status 2, no traceback and nothing written under the data root; several mistakes
come together; the demo config passes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from refinery import preflight
from orchestration.cli import build_parser, main

from helpers.configs import demo_config

REPO = Path(__file__).resolve().parents[1]
DEMO_PHASES = ["warmup", "main", "reasoning", "anneal"]


def write(tmp_path: Path, data: dict, replace: dict[str, str] | None = None) -> str:
    text = yaml.safe_dump(data, sort_keys=False)
    for old, new in (replace or {}).items():  # YAML that safe_dump would quote (a bare `no`)
        text = text.replace(old, new)
    path = tmp_path / "refinery.yaml"
    path.write_text(text)
    return str(path)


def refused(capsys, tmp_path: Path, data: dict, command: str = "demo", replace: dict[str, str] | None = None) -> str:
    """Run `refinery COMMAND --config` in process; assert exit 2, no traceback and an untouched data
    root; return stderr."""
    root = Path(data["data_root"])
    before = root.read_bytes() if root.is_file() else None
    assert main([command, "--config", write(tmp_path, data, replace)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "found before any work started; nothing was run or written" in err
    if before is not None:
        assert root.read_bytes() == before
    else:
        assert not root.exists() or not any(root.iterdir()), sorted(root.rglob("*"))
    return err


def test_quality_classifier_default_buckets_without_a_source(tmp_path, capsys):
    """(a) the default positive_buckets name books and wiki, which no source feeds any more."""
    data = demo_config(tmp_path / "out")
    data["sources"] = [s for s in data["sources"] if s["bucket"] not in {"books", "wiki"}]
    err = refused(capsys, tmp_path, data)
    assert ("  stages.quality.positive_buckets: ['books', 'wiki'] is the default, and no source feeds any of those "
            "buckets (sources feed ['code', 'math', 'web']); set stages.quality.positive_buckets to buckets of your "
            "sources, or stages.quality.enabled: false") in err
    assert "negative_buckets" not in err  # web still has a source


def test_the_shipped_labelled_pages_missing_is_refused_naming_the_field(tmp_path, capsys, monkeypatch):
    """A config that names no labelled set trains on the pages the checkout ships; an install
    without them is told so before any work, with the two ways out."""
    monkeypatch.setattr(preflight, "SHIPPED_LABELLED_SETS", (("data/labelled/not-there.jsonl.gz", None),))
    data = demo_config(tmp_path / "out")
    err = refused(capsys, tmp_path, data)
    assert (f"stages.quality.shipped_labelled_pages: {REPO / 'data/labelled/not-there.jsonl.gz'} not found (an install "
            "without the checkout's data/ folder); give stages.quality.labelled_set, or set shipped_labelled_pages: "
            "false to train on the buckets alone") in err
    data["stages"]["quality"] = {"shipped_labelled_pages": False}
    assert preflight.shipped_labelled_problems(data) == []


@pytest.mark.parametrize("command", ["demo", "train", "validate"])
def test_no_curriculum_when_training_is_asked_for(tmp_path, capsys, command):
    """(b) the graph with training, the trainer and the contract all need a curriculum."""
    data = demo_config(tmp_path / "out")
    del data["curriculum"]
    err = refused(capsys, tmp_path, data, command)
    assert "  curriculum: no curriculum declared; add a `curriculum:` section with total_tokens and phases" in err


def test_no_curriculum_is_fine_for_the_funnel_report(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    del data["curriculum"]
    assert preflight.check(write(tmp_path, data), preflight.DEFINITIONS)[1] == []
    assert main(["funnel", "--config", str(tmp_path / "refinery.yaml")]) == 1  # past the preflight: nothing made yet
    err = capsys.readouterr().err
    assert "nothing materialized yet" in err and "make ui CONFIG=" in err
    assert "refinery demo" not in err  # the demo trains, so it would refuse a config without a curriculum


@pytest.mark.parametrize("command", ["demo", "validate", "scan"])
def test_wrong_eval_set_path(tmp_path, capsys, command):
    """(c) passed `refinery validate` and failed 60 s into the run."""
    data = demo_config(tmp_path / "out")
    data["contamination"]["eval_sets"][0]["path"] = "evals/demo_evl.jsonl"
    extra = ["--phase", "anneal"] if command == "scan" else []
    path = write(tmp_path, data)
    assert main([command, "--config", path, *extra]) == 2
    err = capsys.readouterr().err
    assert (f"  contamination.eval_sets[0].path: {tmp_path / 'evals' / 'demo_evl.jsonl'} is not a file; give a JSONL "
            f"file of {{\"id\", \"text\"}} lines") in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_source_glob_that_matches_nothing(tmp_path, capsys):
    """(d) silently dropped that source's partitions."""
    data = demo_config(tmp_path / "out")
    data["sources"][2]["path"] = "../data/sample/kode/*.jsonl.gz"
    err = refused(capsys, tmp_path, data)
    assert (f"  sources[2].path: glob '../data/sample/kode/*.jsonl.gz' matches no file (relative to the config's "
            f"folder: {tmp_path.parent / 'data' / 'sample' / 'kode'}/*.jsonl.gz)") in err


def test_unwritable_data_root(tmp_path, capsys):
    """(e) surfaced only at the first write."""
    data = demo_config(tmp_path / "out")
    if os.geteuid() == 0:  # root writes through permission bits; /proc takes no new folder from anyone
        data["data_root"] = "/proc/refinery-preflight/out"
        parent = Path("/proc")
    else:
        parent = tmp_path / "locked"
        parent.mkdir()
        parent.chmod(0o500)
        data["data_root"] = str(parent / "out")
    err = refused(capsys, tmp_path, data)
    assert f"  data_root: {data['data_root']} is not writable: making a folder in {parent} failed (" in err
    assert not Path(data["data_root"]).exists()


def test_a_command_that_only_reads_the_data_root_does_not_need_to_write_it(tmp_path):
    """`train --run-dir` elsewhere reads shards from a read-only data root; so do funnel and
    `validate --plot`."""
    needs_of = dict(build_parser()._subparsers._group_actions[0].choices)
    train = needs_of["train"].parse_args(["--config", "c.yaml", "--run-dir", str(tmp_path / "run")])
    assert train.needs(train) == preflight.Needs(curriculum=True, writes=False)
    train = needs_of["train"].parse_args(["--config", "c.yaml"])
    assert train.needs(train).writes
    validate = needs_of["validate"].parse_args(["c.yaml", "--plot", "p.png"])
    assert not validate.needs(validate).writes
    funnel = needs_of["funnel"].parse_args(["--config", "c.yaml"])
    assert funnel.needs == preflight.READ_ONLY


def test_data_root_that_is_a_file(tmp_path, capsys):
    """(f) and a data root under a file."""
    data = demo_config(tmp_path / "out")
    (tmp_path / "out").write_text("my notes\n")
    err = refused(capsys, tmp_path, data)
    assert f"  data_root: {tmp_path / 'out'} is a file; point data_root at a folder" in err
    data["data_root"] = str(tmp_path / "out" / "run1")
    assert main(["train", "--config", write(tmp_path, data)]) == 2
    assert f"  data_root: {tmp_path / 'out'} is a file, so {tmp_path / 'out' / 'run1'} cannot be created" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == "my notes\n"


def test_unknown_anneal_phase(tmp_path, capsys):
    """(g) the rescan schedule and sensor watch contamination.anneal_phase."""
    data = demo_config(tmp_path / "out")
    data["contamination"]["anneal_phase"] = "aneal"
    err = refused(capsys, tmp_path, data)
    assert f"  contamination.anneal_phase: no phase 'aneal'; use one of {DEMO_PHASES}" in err


def test_bucket_name_unsafe_as_a_path_part(tmp_path, capsys):
    """(h) a bucket names folders of the data root; `../web` would write beside it."""
    data = demo_config(tmp_path / "out")
    data["buckets"][0] = "../web"
    data["sources"][0]["bucket"] = "../web"
    err = refused(capsys, tmp_path, data)
    assert ("  buckets[0]: '../web' is not safe as a folder name (buckets name folders of the data root); use "
            "letters, digits, '_', '-' and '.', starting with a letter or digit") in err


def test_yaml_no_in_a_language_list(tmp_path, capsys):
    """`languages: [en, no]`: YAML 1.1 reads Norwegian as false."""
    data = demo_config(tmp_path / "out")
    data["stages"]["language"]["languages"] = ["en", "NORWEGIAN"]
    err = refused(capsys, tmp_path, data, replace={"- NORWEGIAN": "- no"})
    assert "  stages.language.languages: item 1, False, is not a language code" in err and "write 'no' in quotes" in err


def test_yaml_boolean_where_any_text_was_meant(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["contamination"]["eval_sets"][0]["name"] = "SWITCH"
    err = refused(capsys, tmp_path, data, "validate", replace={"name: SWITCH": "name: on"})
    assert ("  contamination.eval_sets[0].name: True is not text: YAML reads an unquoted no, off, yes or on as a "
            "boolean; quote the word you meant") in err


def test_curriculum_that_cannot_make_manifests(tmp_path, capsys):
    """Weights that do not sum to 1 stopped the graph at phase_manifests; the demo now refuses first."""
    data = demo_config(tmp_path / "out")
    data["curriculum"]["phases"][1]["weights"]["web"] = 0.9
    err = refused(capsys, tmp_path, data)
    assert "  curriculum.phases[1].weights: weights of phase 'main' sum to 1.28, not 1; scale them" in err


def test_several_mistakes_are_reported_at_once(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["sources"][1]["path"] = str(tmp_path / "nowhere" / "*.jsonl.gz")
    data["contamination"]["eval_sets"][0]["path"] = str(tmp_path / "missing.jsonl")
    data["contamination"]["anneal_phase"] = "cooldown"
    data["buckets"].append("a/b")
    data["sources"][3]["name"] = "SWITCH"
    data["stages"]["language"]["languages"] = ["en", "NORWEGIAN"]
    (tmp_path / "out").write_text("")
    # The schema rejects the two YAML booleans; the checks that need a whole config still run, on the
    # rest of it, so the bucket name and the phase come in the same report.
    err = refused(capsys, tmp_path, data, replace={"name: SWITCH": "name: off", "- NORWEGIAN": "- no"})
    expected = [
        "  sources[3].name: False is not text: YAML reads an unquoted no, off, yes or on as a boolean",
        "  stages.language.languages: item 1, False, is not a language code",
        "  buckets[5]: 'a/b' is not safe as a folder name",
        "  contamination.anneal_phase: no phase 'cooldown'",
        f"  sources[1].path: glob '{tmp_path / 'nowhere' / '*.jsonl.gz'}' matches no file",
        f"  contamination.eval_sets[0].path: {tmp_path / 'missing.jsonl'} is not a file",
        f"  data_root: {tmp_path / 'out'} is a file",
    ]
    for line in expected:
        assert line in err, line
    assert ": 7 problem(s) found before any work started" in err
    assert len([line for line in err.splitlines() if line.startswith("  ")]) == 7


def test_the_demo_config_passes_every_preflight():
    for needs in (preflight.GRAPH, preflight.DEFINITIONS, preflight.READ_ONLY):
        cfg, problems = preflight.check(REPO / "configs" / "demo.yaml", needs)
        assert problems == [] and cfg is not None and cfg.curriculum is not None


def test_dynamic_batches_and_s3_roots_are_not_probed(tmp_path):
    """Dynamic partitions take files as they arrive (an empty glob is the start); an s3:// data root
    is not probed (no network in the preflight)."""
    data = demo_config(tmp_path / "out")
    data["sources"][0]["path"] = str(tmp_path / "later" / "*.warc.gz")
    data["partitions"]["dynamic"] = True
    data["data_root"] = "s3://bucket/run"
    assert preflight.check(write(tmp_path, data), preflight.GRAPH)[1] == []


def test_the_dagster_definitions_refuse_to_load_with_every_problem(tmp_path):
    from orchestration.definitions import build_definitions

    data = demo_config(tmp_path / "out")
    data["sources"][0]["path"] = str(tmp_path / "none" / "*.warc")
    data["contamination"]["anneal_phase"] = "cooldown"
    with pytest.raises(preflight.PreflightError) as err:
        build_definitions(write(tmp_path, data))
    assert err.value.problems == [
        f"contamination.anneal_phase: no phase 'cooldown'; use one of {DEMO_PHASES}",
        f"sources[0].path: glob '{tmp_path / 'none' / '*.warc'}' matches no file",
    ]
    assert not (tmp_path / "out").exists()


def test_a_refused_command_prints_no_traceback(tmp_path):
    data = demo_config(tmp_path / "out")
    data["sources"][0]["path"] = str(tmp_path / "none" / "*.warc")
    out = subprocess.run([sys.executable, "-m", "orchestration.cli", "demo", "--config", write(tmp_path, data)],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DAGSTER_HOME": str(tmp_path / "home")})
    assert out.returncode == 2 and out.stdout == ""
    assert "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [
        f"refinery demo: {tmp_path / 'refinery.yaml'}: 1 problem(s) found before any work started; nothing was run "
        f"or written",
        f"  sources[0].path: glob '{tmp_path / 'none' / '*.warc'}' matches no file",
    ]
    assert not (tmp_path / "out").exists() and not (tmp_path / "home").exists()


def test_loading_a_config_runs_no_user_code_and_the_preflight_builds_its_custom_filters(tmp_path):
    """load_config checks the schema only; the preflight imports and builds each custom filter and
    names the field of every one that cannot be built, even when the schema rejects another field."""
    from refinery.config import load_config

    (tmp_path / "loud_filter.py").write_text("raise RuntimeError('imported')\n")
    data = demo_config(tmp_path / "out")
    data["stages"]["custom_filters"] = [{"name": "loud", "path": "loud_filter:Loud"},
                                        {"name": "digits", "path": "docs.examples.min_digits:MinDigits",
                                         "params": {"min_digits": 0}}]
    path = write(tmp_path, data)
    assert load_config(path).stages.custom_filters[0].path == "loud_filter:Loud"
    expected = ["stages.custom_filters[0].path: importing 'loud_filter' raised RuntimeError: imported",
                "stages.custom_filters[1].params: MinDigits(**params) raised ValueError: min_digits must be at least "
                "1, got 0"]
    assert preflight.check(path, preflight.READ_ONLY)[1] == expected
    data["seed"] = "any"
    assert preflight.check(write(tmp_path, data), preflight.READ_ONLY)[1][1:] == expected


def test_the_demo_and_the_dagster_definitions_refuse_a_custom_filter_that_cannot_be_built(tmp_path, capsys):
    from orchestration.definitions import build_definitions

    data = demo_config(tmp_path / "out")
    data["stages"]["custom_filters"] = [{"name": "digits", "path": "no_such_pkg.filters:MinDigits"}]
    problem = "stages.custom_filters[0].path: cannot import 'no_such_pkg.filters': No module named 'no_such_pkg'"
    with pytest.raises(preflight.PreflightError) as err:
        build_definitions(write(tmp_path, data))
    assert err.value.problems[0].startswith(problem)
    assert f"  {problem}" in refused(capsys, tmp_path, data)


def test_config_curriculum_and_documents_load_without_the_stages_or_the_layers_above():
    """Loading a config imports no stage (a custom filter's module is the preflight's to import), only
    the stage registry, which is names and imports nothing of the project; and the config, curriculum
    and documents packages stand on the floor below assets/ and training/."""
    code = ("import sys, refinery.config, refinery.curriculum, refinery.documents\n"
            "refinery.config.load_config('configs/demo.yaml')\n"
            "print(sorted(m for m in sys.modules if m.startswith(('refinery.stages', 'assets', 'training', "
            "'orchestration'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['refinery.stages', 'refinery.stages.registry']"


@pytest.mark.parametrize("execution, expected", [
    ({"engine": "ray"}, "execution: engine: ray needs `address`"),
    ({"engine": "ray", "address": "head node:6379"}, "execution.address: 'head node:6379' is not a Ray address"),
    ({"engine": "ray", "address": "host-cluster", "max_retries": -1}, "execution.max_retries"),
    ({"engine": "ray", "address": "127.0.0.1:99999"}, "execution.address: '127.0.0.1:99999': port 99999 is not a TCP port"),
    ({"engine": "ray", "address": "auto"}, "execution.address: auto joins whichever cluster this host registered last"),
    ({"engine": "dask"}, "execution.engine"),
    ({"engine": "local", "launch_trainer_on_ray": True}, "training.launch: ray needs the cluster's address"),
])
def test_an_execution_engine_that_cannot_run_is_refused(tmp_path, capsys, execution, expected):
    data = demo_config(tmp_path / "out")
    if execution.pop("launch_trainer_on_ray", False):
        data.setdefault("training", {})["launch"] = "ray"
    data["execution"] = execution
    assert expected in refused(capsys, tmp_path, data)


def test_the_ray_engine_without_ray_installed_is_refused(tmp_path, capsys, monkeypatch):
    real = preflight.importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    data = demo_config(tmp_path / "out")
    data["execution"] = {"engine": "ray", "address": "127.0.0.1:6379"}
    data.setdefault("training", {})["launch"] = "ray"
    err = refused(capsys, tmp_path, data)
    assert "execution.engine: ray, and the `ray` package is not installed here" in err
    assert "training.launch: ray, and the `ray` package is not installed here" in err


@pytest.mark.parametrize("command, execution, launch", [
    ("validate", {"engine": "ray", "address": "127.0.0.1:1"}, "local"),
    ("demo", {"engine": "ray", "address": "127.0.0.1:1"}, "local"),
    ("demo", {"engine": "local", "address": "ray://127.0.0.1:1"}, "ray"),
])
def test_an_unreachable_ray_address_is_refused_before_any_work(tmp_path, capsys, command, execution, launch):
    """Issue 38: `address: 127.0.0.1:1` passed validate and the preflight, then hung in ray.init."""
    data = demo_config(tmp_path / "out")
    data["execution"] = execution
    data.setdefault("training", {})["launch"] = launch
    started = time.monotonic()
    err = refused(capsys, tmp_path, data, command)
    assert time.monotonic() - started < 30
    field = "execution.engine" if execution["engine"] == "ray" else "training.launch"
    assert (f"  execution.address: no Ray cluster answers at {execution['address']}: nothing listens there "
            f"(Connection refused) ({field}: ray)") in err


def test_a_ray_address_that_accepts_but_never_answers_is_refused_within_seconds(tmp_path, capsys):
    """A port that takes the connection and says nothing (a firewall's tarpit, a wedged head): the
    probe's deadline, not ray.init's minutes of retries."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        data = demo_config(tmp_path / "out")
        data["execution"] = {"engine": "ray", "address": address}
        started = time.monotonic()
        err = refused(capsys, tmp_path, data, "validate")
    assert time.monotonic() - started < 30
    assert f"execution.address: no Ray cluster answers at {address}: no answer within 3s" in err


def test_a_server_that_is_not_a_ray_head_is_refused(tmp_path, capsys):
    """Any gRPC server (here one with no Ray service, as a proxy answering for every address is) is
    not a head."""
    import grpc
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        data = demo_config(tmp_path / "out")
        data["execution"] = {"engine": "ray", "address": f"127.0.0.1:{port}"}
        err = refused(capsys, tmp_path, data, "validate")
    finally:
        server.stop(None)
    assert f"no Ray cluster answers at 127.0.0.1:{port}: the server there is not a Ray head (UNIMPLEMENTED)" in err


def test_host_cluster_with_none_registered_is_refused_naming_where_it_looked(tmp_path, capsys, monkeypatch):
    """`host-cluster` (Ray's `auto`, asked for by name) finds the cluster this host registered, and
    none is refused; plain `auto` is refused by the schema (above)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    data = demo_config(tmp_path / "out")
    data["execution"] = {"engine": "ray", "address": "host-cluster"}
    err = refused(capsys, tmp_path, data, "validate")
    assert (f"execution.address: host-cluster: no Ray cluster is registered on this host (RAY_ADDRESS is unset and "
            f"{tmp_path}/raytmp/ray/ray_current_cluster does not exist)") in err
    (tmp_path / "raytmp" / "ray").mkdir(parents=True)
    (tmp_path / "raytmp" / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
    err = refused(capsys, tmp_path, data, "validate")
    assert "execution.address: no Ray cluster answers at host-cluster (127.0.0.1:1): nothing listens there" in err


def test_connect_refuses_an_unreachable_head_instead_of_hanging():
    """The engine's own connect (a cluster gone between the preflight and a step) is bounded too."""
    from refinery.ray_engine import connect

    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"execution.address: no Ray cluster answers at 127.0.0.1:1: nothing listens"):
        connect("127.0.0.1:1")
    assert time.monotonic() - started < 30


def test_a_difficulty_model_file_that_is_no_model_is_refused_by_the_preflight(tmp_path, capsys):
    """Issue 38: the preflight checked only that stages.difficulty.model_path names a file; now its
    zip directory and headers (no array read): a file that decompresses to 256 MB is refused."""
    from helpers.bombs import write_difficulty_model_bomb

    bomb = tmp_path / "reference.npz"
    write_difficulty_model_bomb(bomb, 256 << 20)
    data = demo_config(tmp_path / "out")
    data.setdefault("stages", {})["difficulty"] = {"enabled": True, "model_path": str(bomb)}
    err = refused(capsys, tmp_path, data)
    assert f"  stages.difficulty.model_path: {bomb}: not a reference model file (its members declare" in err
    bomb.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    assert f"stages.difficulty.model_path: {bomb}: not a reference model file (no meta member" in refused(capsys, tmp_path, data)


def fake_ray_head():
    """A gRPC server answering the one call the probe makes of a Ray head (the GCS's cluster id)."""
    import grpc
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "ray.rpc.NodeInfoGcsService", {"GetClusterId": grpc.unary_unary_rpc_method_handler(lambda request, context: b"")}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_host_cluster_joins_the_registered_address_and_names_it_before_any_task(tmp_path, capsys, monkeypatch):
    """Issue 38: `auto` joined whatever cluster the host registered, silently. `host-cluster` is
    resolved to the registered address, passes the preflight when a head answers there, and the
    engine prints the cluster it joined (address, nodes, CPUs) before it makes any task."""
    import types

    from refinery import ray_engine

    server, address = fake_ray_head()
    calls: list = []
    fake_ray = types.SimpleNamespace(
        is_initialized=lambda: False, shutdown=lambda: None,
        init=lambda **kw: calls.append(("init", kw["address"])),
        nodes=lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": True, "Resources": {"CPU": 1.0}},
                       {"Alive": False, "Resources": {"CPU": 8.0}}],
        get_runtime_context=lambda: types.SimpleNamespace(gcs_address=address))
    monkeypatch.setattr(ray_engine, "_connected_to", None)
    monkeypatch.setenv("RAY_ADDRESS", address)
    try:
        data = demo_config(tmp_path / "out")
        data["execution"] = {"engine": "ray", "address": "host-cluster"}
        _, problems = preflight.check(write(tmp_path, data), preflight.GRAPH)
        assert not [p for p in problems if p.startswith("execution")], problems
        monkeypatch.setitem(sys.modules, "ray", fake_ray)
        ray_engine.connect("host-cluster")
    finally:
        server.stop(None)
    assert calls == [("init", address)]
    assert capsys.readouterr().err == (f"refinery: joined the Ray cluster at {address} (execution.address host-cluster): "
                                       f"2 node(s), 3 CPU(s)\n")
