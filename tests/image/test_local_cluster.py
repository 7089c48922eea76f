"""Local SageMaker-style clusters of the real image with podman-compose,
and the compose writer's output."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import compose_cluster, http, local_cluster, serving

pytestmark = pytest.mark.container

ClusterSpec = local_cluster.ClusterSpec


# ------------------------------------------------------------------ the compose writer ----
def test_each_host_gets_its_own_job_on_the_compose_interface(tmp_path):
    spec = ClusterSpec(hosts=3, workdir=tmp_path, hyperparameters={"epochs": 3})
    job = local_cluster.job_config(spec, "algo-2")
    assert job.resources.current_host == "algo-2"
    assert job.resources.hosts == ("algo-1", "algo-2", "algo-3")
    assert job.resources.network_interface_name == "eth0"
    assert job.paths.root == tmp_path.resolve() / "algo-2"


def test_shard_deals_sorted_files_round_robin():
    assert local_cluster.shard(["c", "a", "b"], ["algo-1", "algo-2"]) == {
        "algo-1": ["a", "c"],
        "algo-2": ["b"],
    }
    assert local_cluster.shard(["a"], ["algo-1", "algo-2", "algo-3"]) == {
        "algo-1": ["a"],
        "algo-2": [],
        "algo-3": [],
    }


def test_write_cluster_per_host_trees(tmp_path):
    data = tmp_path / "data"
    for name in ("part-0.csv", "part-1.csv", "part-2.csv"):
        (data / "train").mkdir(parents=True, exist_ok=True)
        (data / "train" / name).write_text(name)
    (data / "validation").mkdir()
    (data / "validation" / "v.csv").write_text("v")
    spec = ClusterSpec(
        hosts=2,
        workdir=tmp_path / "work",
        data=data,
        image="img:tag",
        sharded=frozenset({"train"}),
        hyperparameters=local_cluster.read_hyperparameters(None, ["epochs=3", "optimizer=adam"]),
    )
    compose = yaml.safe_load(local_cluster.write_cluster(spec).read_text())
    work = (tmp_path / "work").resolve()

    assert list(compose["services"]) == ["algo-1", "algo-2"]
    algo2 = compose["services"]["algo-2"]
    assert algo2["image"] == "img:tag" and algo2["hostname"] == "algo-2"
    assert algo2["command"] == ["train"]
    assert algo2["networks"] == {"sagemaker-local": {"aliases": ["algo-2"]}}
    assert sorted(algo2["volumes"]) == sorted(
        [
            f"{work}/algo-2/input/config:/opt/ml/input/config:ro",
            f"{work}/algo-2/output:/opt/ml/output",
            f"{work}/algo-2/model:/opt/ml/model",
            f"{work}/algo-2/checkpoints:/opt/ml/checkpoints",
            f"{work}/algo-2/input/data/train:/opt/ml/input/data/train:ro",
            f"{data.resolve()}/validation:/opt/ml/input/data/validation:ro",
        ]
    )
    config = work / "algo-2" / "input" / "config"
    assert json.loads((config / "resourceconfig.json").read_text())["current_host"] == "algo-2"
    assert json.loads((config / "hyperparameters.json").read_text()) == {
        "epochs": "3",
        "optimizer": "adam",
    }
    channels = json.loads((config / "inputdataconfig.json").read_text())
    assert channels["train"]["S3DistributionType"] == "ShardedByS3Key"
    assert channels["validation"]["S3DistributionType"] == "FullyReplicated"
    assert channels["train"]["ContentType"] == "text/csv"
    assert sorted(p.name for p in (work / "algo-1/input/data/train").iterdir()) == [
        "part-0.csv",
        "part-2.csv",
    ]
    assert [p.name for p in (work / "algo-2/input/data/train").iterdir()] == ["part-1.csv"]


def test_hyperparameters_file_values_are_written_as_sagemaker_strings(tmp_path):
    path = tmp_path / "hp.json"
    path.write_text(json.dumps({"epochs": 3, "lr": 0.1, "model": "mlp", "flag": True}))
    spec = ClusterSpec(
        hosts=1,
        workdir=tmp_path / "work",
        hyperparameters=local_cluster.read_hyperparameters(path, ["epochs=5"]),
    )
    local_cluster.write_cluster(spec)
    written = local_cluster.host_paths(spec, "algo-1").hyperparameters
    assert json.loads(written.read_text()) == {
        "epochs": "5",
        "lr": "0.1",
        "model": "mlp",
        "flag": "true",
    }


def test_an_unsupported_engine_choice_is_refused_with_the_valid_ones(monkeypatch):
    monkeypatch.setenv("CONTAINER_ENGINE", "lxc")
    with pytest.raises(
        RuntimeError, match="CONTAINER_ENGINE=lxc is not supported. Choose between docker, podman."
    ):
        local_cluster.Engine.detect()


# ------------------------------------------------------------------------ real clusters ---
def job_spec(
    tmp_path: Path, image: str, digits: Path, hosts: int, **hyperparameters
) -> ClusterSpec:
    values = {
        "epochs": "3",
        "processes_per_host": "1",
        "learning_rate": "0.002",
        "model": "mlp",
        **{k: str(v) for k, v in hyperparameters.items()},
    }
    return ClusterSpec(
        hosts=hosts,
        workdir=tmp_path / f"cluster-{hosts}",
        data=digits,
        image=image,
        hyperparameters=values,
    )


def run_job(engine, spec: ClusterSpec, name: str) -> tuple[dict, dict]:
    """`up --abort-on-container-exit` as make local-train does; exit codes and logs."""
    with compose_cluster(engine, spec, name) as cluster:
        cluster.compose("up", "--abort-on-container-exit", check=False, capture=True, timeout=900)
        codes = cluster.wait_all_exited(120)
        return codes, {host: cluster.logs(host) for host in cluster.containers()}


def model_files(spec: ClusterSpec, host: str) -> list[str]:
    model = local_cluster.host_paths(spec, host).model_dir
    return sorted(str(p.relative_to(model)) for p in model.rglob("*"))


@pytest.fixture(scope="module")
def two_host_job(engine, image, digits, tmp_path_factory):
    # --report-bindings: each node's OpenMPI daemon prints "[its hostname:pid] MCW rank N ...",
    # evidence of where every rank really ran.
    spec = job_spec(
        tmp_path_factory.mktemp("two"), image, digits, hosts=2, mpi_options="--report-bindings"
    )
    codes, logs = run_job(engine, spec, "two")
    return spec, codes, logs


def test_two_host_job(two_host_job):
    spec, codes, logs = two_host_job
    everything = "\n".join(f"--- {h}\n{text[-3000:]}" for h, text in logs.items())
    assert codes == {"algo-1": 0, "algo-2": 0}, everything
    assert "model/1/saved_model.pb" in model_files(spec, "algo-1")
    assert "metadata.json" in model_files(spec, "algo-1")
    assert model_files(spec, "algo-2") == [], "only the leader writes the model"
    leader = logs["algo-1"]
    assert "of 2: algo-1, algo-2" in leader and "world size 2" in leader
    assert "-np 2" in leader or "'-np', '2'" in leader
    for rank, host in ((0, "algo-1"), (1, "algo-2")):
        assert re.search(rf"\[{host}:\d+\] MCW rank {rank} ", leader), (
            f"no sign that rank {rank} ran on {host}:\n{leader[-3000:]}"
        )


@pytest.mark.parametrize("leader", ["silent", pytest.param("absent", marks=pytest.mark.slow)])
def test_worker_without_leader_fails_naming_it(engine, image, digits, tmp_path, leader):
    """silent: algo-1 resolves but never runs the launcher; absent: algo-1 never exists."""
    spec = job_spec(tmp_path, image, digits, hosts=2, leader_timeout=15, host_timeout=15)

    def silence_leader(document):
        document["services"]["algo-1"]["command"] = ["sleep", "600"]

    edit = silence_leader if leader == "silent" else None
    with compose_cluster(engine, spec, f"noleader-{leader}", edit=edit) as cluster:
        services = [] if leader == "silent" else ["algo-2"]
        cluster.compose("up", "-d", *services, capture=True, timeout=300)
        deadline = time.monotonic() + 180
        while cluster.state("algo-2").get("Running"):
            assert time.monotonic() < deadline, "the worker is still waiting after 180 s"
            time.sleep(1)
        code = cluster.state("algo-2")["ExitCode"]
        logs = cluster.logs("algo-2")[-3000:]
    assert code == 3, logs  # a cluster failure
    failure = local_cluster.host_paths(spec, "algo-2").failure_file
    assert failure.exists(), logs
    print(f"algo-2 failure, leader {leader}: {failure.read_text()}")
    assert "algo-1" in failure.read_text(), failure.read_text()


# ------------------------------------------------------------------------------- serve ----
def test_serve_answers_with_the_model_of_the_compose_job(engine, image, digits, two_host_job):
    spec, codes, _ = two_host_job
    assert codes.get("algo-1") == 0, "the 2-host job failed; nothing to serve"
    model = local_cluster.host_paths(spec, "algo-1").model_dir
    with serving(engine, image, model) as url:
        rows = np.loadtxt(digits / "validation" / "digits.csv", delimiter=",")[:50]
        body = json.dumps({"instances": rows[:, 1:].tolist()}).encode()
        status, answer = http(
            "POST",
            f"{url}/invocations",
            body,
            {"Content-Type": "application/json", "Accept": "application/json"},
            timeout=60,
        )
        assert status == 200, answer
        predictions = json.loads(answer)["predictions"]
        assert len(predictions) == 50
        correct = sum(
            str(p["class"]) == str(int(label)) for p, label in zip(predictions, rows[:, 0])
        )
        assert correct >= 25, f"only {correct}/50 right: {predictions[:3]}"
        status, answer = http("POST", f"{url}/invocations", b"1,2,x", {"Content-Type": "text/csv"})
        assert status == 400, answer
