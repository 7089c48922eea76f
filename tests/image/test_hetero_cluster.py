"""A heterogeneous cluster of real containers (scripts/local_cluster.py --instance-group): two
training hosts and a data host, as SageMaker describes them to each container; the script
that checks its group on every host (tests/container/test_instance_groups.py runs the same
on loopback launchers), a data host that dies, and the built-in trainer reading nothing but
the data host's tf.data service."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import add_code, compose_cluster, local_cluster, wait_for_log

from scripts.digits_files import write_digits
from tests.container.test_instance_groups import PROBE

pytestmark = pytest.mark.container

GROUPS = (("train", 2, "ml.c5.xlarge"), ("data", 1, "ml.c5.large"))
HOSTS = ("algo-1", "algo-2", "algo-3")


def hetero_spec(tmp_path, image, **hyperparameters) -> local_cluster.ClusterSpec:
    return local_cluster.ClusterSpec(
        hosts=3,
        groups=GROUPS,
        workdir=tmp_path / "cluster",
        image=image,
        hyperparameters={
            "sagemaker_program": "probe.py",
            "processes_per_host": 1,
            "sagemaker_distribution_instance_groups": '["train"]',
            "heartbeat_timeout": 10,
            **hyperparameters,
        },
    )


@pytest.fixture
def code(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    return folder


def test_the_local_cluster_writes_each_host_its_group():
    spec = local_cluster.spec_from_arguments(
        local_cluster.parse_arguments(
            ["write", "--instance-group", "train:2:ml.p4d.24xlarge", "--instance-group", "data:1"]
        )
    )
    resources = local_cluster.job_config(spec, "algo-3").resources
    assert (resources.hosts, resources.current_group, resources.instance_type) == (
        HOSTS,
        "data",
        "local",
    )
    assert [(g.name, g.hosts) for g in resources.instance_groups] == [
        ("train", ("algo-1", "algo-2")),
        ("data", ("algo-3",)),
    ]
    with pytest.raises(SystemExit):
        local_cluster.parse_arguments(["write", "--instance-group", "train"])


def test_ranks_on_the_training_containers_and_the_script_alone_on_the_data_container(
    engine, image, tmp_path, code
):
    spec = hetero_spec(tmp_path, image, **{"train-seconds": 2})
    with compose_cluster(engine, spec, "hetero", edit=add_code(code)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        codes = cluster.wait_all_exited(300)
        logs = {host: cluster.logs(host) for host in HOSTS}
    assert codes == dict.fromkeys(HOSTS, 0), logs
    ranks = [
        json.loads(
            (
                local_cluster.host_paths(spec, host).output_data_dir / f"{host}-{rank}.json"
            ).read_text()
        )
        for rank, host in enumerate(HOSTS[:2])
    ]
    assert [
        (r["SM_CURRENT_INSTANCE_GROUP"], r["OMPI_COMM_WORLD_SIZE"], r["sum"]) for r in ranks
    ] == [("train", "2", 2)] * 2
    data = json.loads(
        (local_cluster.host_paths(spec, "algo-3").output_data_dir / "algo-3-alone.json").read_text()
    )
    assert (
        data["SM_CURRENT_INSTANCE_GROUP"],
        data["SM_CURRENT_INSTANCE_TYPE"],
        data["OMPI_COMM_WORLD_SIZE"],
        data["SM_IS_HETERO"],
    ) == ("data", "ml.c5.large", None, "true")
    assert "the leader algo-1 reports exit code 0" in logs["algo-3"]


def test_a_data_container_that_dies_is_named_and_ends_the_job(engine, image, tmp_path, code):
    spec = hetero_spec(tmp_path, image, **{"train-seconds": 300})
    with compose_cluster(engine, spec, "hetero-dies", edit=add_code(code)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        wait_for_log(cluster, "algo-3", "runs the script on its own", timeout=120)
        engine.run("kill", "--signal", "KILL", cluster.containers()["algo-3"])
        codes = cluster.wait_all_exited(90)
        leader = cluster.logs("algo-1")
    assert (codes["algo-1"], codes["algo-2"]) == (3, 3), leader[-3000:]
    failure = (local_cluster.host_paths(spec, "algo-1").output_dir / "failure").read_text()
    assert failure.startswith("lost contact with host algo-3: "), failure


def permuted_copy(source: Path, target: Path) -> None:
    """`source`'s image folder under the same file names, each class folder holding pictures
    of the next class: a rank that decoded these itself would learn every digit as its
    neighbour, and score near 0 on the true validation pictures."""
    classes = sorted(folder.name for folder in source.iterdir())
    for index, name in enumerate(classes):
        donors = sorted((source / classes[(index + 1) % len(classes)]).iterdir())
        (target / name).mkdir(parents=True)
        for position, file in enumerate(sorted((source / name).iterdir())):
            shutil.copy(donors[position % len(donors)], target / name / file.name)


@pytest.mark.slow
def test_the_built_in_trainer_learns_from_the_data_containers_pictures_alone(
    engine, image, tmp_path
):
    """The training containers hold pictures under the wrong class names, the data container
    the true ones at the same paths: the job learns the true digits only if every training
    batch was decoded and augmented on the data container."""
    true, data = tmp_path / "true", tmp_path / "data"
    write_digits(true, "images", size=16)
    (data / "validation").parent.mkdir(parents=True)
    shutil.copytree(true / "validation", data / "validation")
    permuted_copy(true / "train", data / "train")
    spec = local_cluster.ClusterSpec(
        hosts=3,
        groups=GROUPS,
        workdir=tmp_path / "cluster",
        image=image,
        data=data,
        hyperparameters={
            "sagemaker_distribution_instance_groups": "train",
            "model": "cnn",
            "epochs": 6,
            "augment": "true",
            "processes_per_host": 1,
        },
    )

    def true_pictures_on_the_data_host(document) -> None:
        volumes = document["services"]["algo-3"]["volumes"]
        volumes[:] = [volume for volume in volumes if ":/opt/ml/input/data/train:" not in volume]
        volumes.append(f"{true / 'train'}:/opt/ml/input/data/train:ro")

    with compose_cluster(
        engine, spec, "hetero-served", edit=true_pictures_on_the_data_host
    ) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        codes = cluster.wait_all_exited(600)
        logs = {host: cluster.logs(host) for host in HOSTS}
    assert codes == dict.fromkeys(HOSTS, 0), logs["algo-1"][-3000:] + logs["algo-3"][-2000:]
    assert (
        "training input served by the data hosts' tf.data service at grpc://algo-3:6000"
        in logs["algo-1"]
    )
    metadata = json.loads(
        (local_cluster.host_paths(spec, "algo-1").model_dir / "metadata.json").read_text()
    )
    assert metadata["final_metrics"]["val_accuracy"] > 0.4, metadata["final_metrics"]


def test_several_groups_and_none_named_to_train_fail_every_container_with_exit_2(
    engine, image, tmp_path, code
):
    spec = hetero_spec(tmp_path, image, sagemaker_distribution_instance_groups="")
    with compose_cluster(engine, spec, "hetero-unnamed", edit=add_code(code)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        codes = cluster.wait_all_exited(120)
    assert codes == dict.fromkeys(HOSTS, 2)
    for host in HOSTS:
        failure = (local_cluster.host_paths(spec, host).output_dir / "failure").read_text()
        assert failure.startswith(
            "this job has 2 instance groups, train (2 x ml.c5.xlarge), "
            "data (1 x ml.c5.large), and names none to train"
        ), failure
