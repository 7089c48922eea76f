"""Property: whatever SageMaker's config files hold, the launcher reads a coherent job or
refuses it with a ConfigError (exit code 2, a message in the failure file), never another
exception (exit 1, "internal error in the launcher", a traceback).

The inputs: the files of input/config as SageMaker writes them (hyperparameters.json's values
all strings) with their fields mixed up, and hostile shapes: other JSON types, NaN and
Infinity literals, numbers past any range, deep nesting, text with NUL, lone surrogates and
other scripts, duplicate keys and hosts, bytes that are not UTF-8 or not JSON at all. A job
that is read goes on through validation (job.validated) and the plan (container.plan): what the
launcher would execute must be executable (no NUL in an argument, nothing that is not UTF-8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example
from hypothesis import strategies as st

from container.plan import HOROVOD, TENSORFLOW, make_plan
from job.errors import ConfigError
from job.hyperparameters import describe, names
from job.launch_config import LaunchConfig
from job.paths import MlPaths
from job.sagemaker_config import (
    HOST_NAME,
    INTERFACE_NAME,
    configured_paths,
    read_channels,
    read_job_config,
    read_resources,
    resource_document,
)
from job.source_code import read_source_code
from job.trainer_config import TrainerConfig
from job.validated import validate_hyperparameters
from tests.fuzzing import fuzz

DEEP = "[" * 5000 + "]" * 5000  # valid JSON that Python's parser gives up on (RecursionError)

# Text as it comes: mostly plain, sometimes NUL, control characters, lone surrogates (JSON's
# "\ud800" escape reads as one), other scripts, blanks.
texts = st.one_of(
    st.text(max_size=12),
    st.text(
        st.sampled_from(
            [
                "a",
                "1",
                "-",
                ".",
                "_",
                " ",
                ",",
                ":",
                "/",
                "\x00",
                "\n",
                "\t",
                "\ud800",
                "\udcff",
                "é",
                "\u0661",
                "\u2028",
                "\ufeff",
                "=",
            ]
        ),
        max_size=8,
    ),
    st.sampled_from(["", " ", "algo-1", "algo-2", "\x00", "algo-1\x00", "\ud800", "NaN"]),
)
numbers = st.one_of(
    st.integers(), st.integers(-(10**400), 10**400), st.floats(allow_nan=True, allow_infinity=True)
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, texts),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=3),
    max_leaves=12,
)


def as_bytes(value, style: str) -> bytes:
    """`value` as a file might hold it: compact, with \\u escapes, or mangled."""
    text = json.dumps(value, ensure_ascii=style == "ascii", allow_nan=True)
    if style == "cut":
        text = text[: len(text) // 2]
    if style == "bom":
        return "\ufeff".encode() + text.encode(errors="surrogatepass")
    return text.encode(errors="surrogatepass")  # a lone surrogate: bytes that are not UTF-8


styles = st.sampled_from(["ascii"] * 4 + ["utf-8", "cut", "bom"])
hostile_files = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"",
            b"{",
            b"null",
            b"[]",
            b'"x"',
            b"NaN",
            b"1e999",
            b"-Infinity",
            DEEP.encode(),
            ('{"a":' * 3000 + "1" + "}" * 3000).encode(),
            b'{"hosts": ["algo-1"], "hosts": 3}',
            b"\xff\xfe{\x00}\x00",
        ]
    ),
)

POOL = ["algo-1", "algo-2", "algo-3", "127.0.0.2"]


def mutated(documents, fields, hostile=json_values | texts):
    """Each document as it is (2 in 3), or with one field replaced by anything or dropped."""
    missing = object()
    return st.one_of(
        documents,
        documents,
        st.tuples(documents, st.sampled_from(fields), hostile | st.just(missing)).map(
            lambda t: {
                **{k: v for k, v in t[0].items() if k != t[1]},
                **({} if t[2] is missing else {t[1]: t[2]}),
            }
        ),
    )


def resource_document_of(hosts: list[str], current: int, cuts: list[int], extra: dict) -> dict:
    """resourceconfig.json as SageMaker writes it: the hosts in instance groups cut at `cuts`."""
    bounds = [0, *sorted({cut % len(hosts) for cut in cuts} - {0}), len(hosts)]
    groups = [
        {
            "instance_group_name": f"group-{index}",
            "instance_type": "ml.c5.xlarge",
            "hosts": hosts[start:end],
        }
        for index, (start, end) in enumerate(zip(bounds, bounds[1:]))
    ]
    host = hosts[current % len(hosts)]
    return {
        "current_host": host,
        "hosts": hosts,
        "network_interface_name": "eth0",
        "current_instance_type": "ml.c5.xlarge",
        "current_group_name": next(g["instance_group_name"] for g in groups if host in g["hosts"]),
        "instance_groups": groups,
        **extra,
    }


sagemaker_resources = st.builds(
    resource_document_of,
    st.lists(st.sampled_from(POOL), min_size=1, max_size=4, unique=True),
    st.integers(0, 3),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(
        st.sampled_from(["network_interface_name", "extra"]),
        st.sampled_from(["lo", "ethwe", "eth1"]),
        max_size=1,
    ),
)
group = st.fixed_dictionaries(
    {},
    optional={
        "instance_group_name": st.sampled_from(["train", "data"]) | texts,
        "instance_type": st.sampled_from(["ml.p4d.24xlarge", "ml.c5.xlarge"]) | texts,
        "hosts": st.lists(st.sampled_from(POOL) | texts, max_size=3) | json_values,
    },
)
resource_documents = mutated(
    sagemaker_resources,
    [
        "current_host",
        "hosts",
        "network_interface_name",
        "current_instance_type",
        "current_group_name",
        "instance_groups",
    ],
    json_values
    | texts
    | st.lists(st.sampled_from(POOL) | texts, max_size=4)
    | st.lists(group, max_size=6),
)
resource_files = st.one_of(
    *[st.tuples(resource_documents, styles).map(lambda p: as_bytes(*p))] * 4,
    st.tuples(json_values, styles).map(lambda p: as_bytes(*p)),
    hostile_files,
)


def write(path: Path, content: bytes | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(content)
    return path


def executable(text: str) -> bool:
    """Whether `text` can be an argument or environment value of a program: exec takes
    NUL-terminated bytes, and the launcher's strings become UTF-8."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@example(content=DEEP.encode())  # RecursionError out of json.loads: "internal error"
@example(content=b'{"hosts": ["algo-1\\u0000"], "current_host": "algo-1\\u0000"}')
@example(content=b'{"hosts": ["a,b", "c"], "current_host": "c"}')  # one mpirun -H entry, two hosts
@example(
    content=b'{"hosts": ["algo-1"], "current_host": "algo-1", '
    b'"network_interface_name": "eth0 -mca x"}'
)
@example(content=b'{"hosts": ["algo-1"], "current_host": "algo-1", "current_group_name": ""}')
@fuzz("resourceconfig.json", max_examples=300, content=resource_files)
def test_a_resourceconfig_is_read_whole_or_refused(tmp_path, content):
    path = write(tmp_path / "resourceconfig.json", content)
    try:
        resources = read_resources(path)
    except ConfigError as error:
        assert str(path) in str(error)
        return
    assert resources.current_host in resources.hosts
    assert len(set(resources.hosts)) == len(resources.hosts)
    assert all(HOST_NAME.fullmatch(host) for host in resources.hosts), resources.hosts
    assert INTERFACE_NAME.fullmatch(resources.network_interface_name)
    assert resources.current_host in resources.group_of(resources.current_host).hosts
    # what was read is what the writer writes back (the local cluster and SDK flows rely on
    # it), but for an instance type the file leaves out: the writer names the host's group's
    again = write(tmp_path / "again.json", json.dumps(resource_document(resources)).encode())
    assert replace(read_resources(again), instance_type=resources.instance_type) == resources


channel_specs = mutated(
    st.fixed_dictionaries(
        {
            "ContentType": st.sampled_from(["text/csv", "application/x-recordio", ""]),
            "TrainingInputMode": st.sampled_from(["File", "FastFile", "Pipe"]),
            "S3DistributionType": st.sampled_from(["FullyReplicated", "ShardedByS3Key"]),
            "RecordWrapperType": st.sampled_from(["None", "RecordIO"]),
        }
    ),
    ["ContentType", "TrainingInputMode", "S3DistributionType", "RecordWrapperType"],
    json_values | texts | st.sampled_from(["file", "FILE", "Pipe "]),
)
channel_documents = mutated(
    st.dictionaries(
        st.sampled_from(["train", "validation", "code", "weights"]),
        channel_specs,
        min_size=1,
        max_size=3,
    ),
    [
        "train",
        "validation",
        "a" * 64,
        ".",
        "..",
        "a" * 65,
        "../../model",
        "",
        "tr\x00ain",
        "\ud800",
        "é",
        "train ",
    ],
    channel_specs | json_values,
)
input_data_files = st.one_of(
    *[st.tuples(channel_documents, styles).map(lambda p: as_bytes(*p))] * 4,
    st.tuples(st.dictionaries(texts, json_values, max_size=2), styles).map(lambda p: as_bytes(*p)),
    st.tuples(json_values, styles).map(lambda p: as_bytes(*p)),
    hostile_files,
)


@example(content=b'{"tr\\u0000ain": {}}')  # a channel name no folder or variable can carry
@example(content=b'{"../../model": {}}')  # a channel folder outside input/data
@fuzz("inputdataconfig.json", max_examples=200, content=input_data_files)
def test_an_inputdataconfig_is_read_whole_or_refused(tmp_path, content):
    path = write(tmp_path / "inputdataconfig.json", content)
    try:
        channels = read_channels(path, tmp_path / "data")
    except ConfigError as error:
        assert str(path) in str(error)
        return
    for name, channel in channels.items():
        assert name == channel.name and name not in ("", ".", "..") and "/" not in name
        assert executable(name)  # a folder and SM_CHANNEL_<NAME> (its content type goes as JSON)
        assert channel.input_mode in ("File", "FastFile", "Pipe")
        assert channel.distribution in ("FullyReplicated", "ShardedByS3Key")


# Hyperparameter values as SageMaker hands them over: every one a string, JSON or not.
hostile_values = st.one_of(
    st.sampled_from(
        [
            "1e400",
            "-1e400",
            "1" + "0" * 400,
            "NaN",
            "Infinity",
            "-Infinity",
            "",
            " ",
            "[1, 2]",
            "{}",
            "null",
            '"unclosed',
            "../train.py",
            "-np 3",
            DEEP,
            '"\\ud800"',
            '"\\u0000"',
            "1" * 5000,
            "0x10",
            "1_000",
            "\u0661",
            "-x",
            "--host a,b",
            "-mca plm_rsh_agent evil",
        ]
    ),
    texts,
    json_values.map(lambda value: json.dumps(value, allow_nan=True)),
)
FIELDS = {
    info["name"]: info for config in (TrainerConfig, LaunchConfig) for info in describe(config)
}
TEXT_VALUES = {
    "hidden_units": ["256,128", "8", "0,1"],
    "conv_filters": ["32,64", "4"],
    "image_shape": ["", "8,8,1", "8,8"],
    "profile_steps": ["", "20,30", "30,20"],
    "program": ["train.py", "src/train.py", "", "missing.py"],
    "mpi_options": ["", "-x NCCL_DEBUG=WARN", "--bind-to none", "-mca btl_tcp_if_include lo"],
    "distribution_instance_groups": ["", "homogeneousCluster", '["homogeneousCluster"]'],
    "submit_directory": ["", "file:///nowhere/src.tar.gz"],
}


def valid_value(info: dict):
    """A value of the hyperparameter `info` describes, written as the SDKs write them."""
    low, high = info["minimum"], info["maximum"]
    if info["choices"]:
        plain = st.sampled_from(info["choices"])
    elif info["type"] == "bool":
        plain = st.sampled_from(["true", "false", "True", "False", "1", "0", "yes"])
    elif info["type"] == "int":
        plain = st.integers(int(low or 0), int(high or 10**6)).map(str)
    elif info["type"] == "float":
        plain = st.floats(low or 0.0, high or 1e6).map(repr)
    else:
        plain = st.sampled_from(TEXT_VALUES.get(info["name"], [""])) | texts
    # a plain Estimator's str() of a string, or a framework estimator's JSON of it
    return plain | plain.map(json.dumps) if info["type"] == "str" else plain


named_values = st.sampled_from(sorted(FIELDS)).flatmap(
    lambda name: st.tuples(
        st.sampled_from([name, *FIELDS[name]["aliases"]]), valid_value(FIELDS[name])
    )
)
sagemaker_maps = st.lists(named_values, max_size=6).map(dict)
hyperparameter_maps = mutated(
    st.one_of(
        sagemaker_maps,
        sagemaker_maps.map(lambda m: {**m, "sagemaker_program": "train.py", "user_key": "1"}),
    ),
    sorted(names(TrainerConfig) | names(LaunchConfig)) + ["sagemaker_job_name", "user_key"],
    hostile_values,
)
hyperparameter_maps = st.one_of(
    hyperparameter_maps, hyperparameter_maps, st.dictionaries(texts, hostile_values, max_size=3)
)


def job_root(tmp_path: Path, hyperparameters: dict, program_file: bool) -> MlPaths:
    paths = MlPaths(tmp_path / "ml")
    write(
        paths.resource_config,
        json.dumps(
            {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}
        ).encode(),
    )
    write(paths.hyperparameters, json.dumps(hyperparameters).encode(errors="surrogatepass"))
    write(paths.input_data_config, b'{"train": {"TrainingInputMode": "File"}}')
    (paths.data_dir / "train").mkdir(parents=True, exist_ok=True)
    paths.code_dir.mkdir(parents=True, exist_ok=True)
    write(paths.code_dir / "train.py", b"print('hello')\n" if program_file else None)
    return paths


def plan_of(paths: MlPaths, builtin_only: bool, stack: str, runtime: Path):
    """What the launcher does with a job before it starts anything (container.train_cli)."""
    job = read_job_config(paths)
    settings = validate_hyperparameters(
        job.hyperparameters, {}, job.source_code, builtin_only=builtin_only
    )
    return make_plan(
        job,
        settings,
        gpu_count=0,
        python=sys.executable,
        runtime=runtime,
        environ={"PATH": "/usr/bin"},
        stack=stack,
    )


@example(
    hyperparameters={"learning_rate": "1" + "0" * 400}, builtin_only=False, stack=HOROVOD
)  # OverflowError: int too large to convert to float
@example(hyperparameters={"epochs": DEEP}, builtin_only=False, stack=HOROVOD)
@example(
    hyperparameters={"sagemaker_program": "train.py", "x": DEEP}, builtin_only=False, stack=HOROVOD
)
@example(
    hyperparameters={"sagemaker_program": "train.py", "x": "a\x00b"},
    builtin_only=False,
    stack=HOROVOD,
)  # ValueError: embedded null byte, when mpirun starts
@example(
    hyperparameters={"sagemaker_program": "train.py", "x": "\ud800"},
    builtin_only=False,
    stack=HOROVOD,
)  # UnicodeEncodeError, when mpirun starts
@example(
    hyperparameters={"sagemaker_program": "train.py", "x": '{"\\u0000": null}'},
    builtin_only=False,
    stack=HOROVOD,
)  # the script's argument "\x00=None"
@example(
    hyperparameters={"sagemaker_program": "tr\x00ain.py"}, builtin_only=False, stack=HOROVOD
)  # ValueError out of Path.resolve()
@fuzz(
    "hyperparameters.json",
    max_examples=300,
    hyperparameters=hyperparameter_maps,
    builtin_only=st.booleans(),
    stack=st.sampled_from([HOROVOD, TENSORFLOW]),
)
def test_hyperparameters_make_a_plan_or_a_config_error(
    tmp_path, hyperparameters, builtin_only, stack
):
    paths = job_root(tmp_path, hyperparameters, program_file=True)
    try:
        plan = plan_of(paths, builtin_only, stack, tmp_path / "runtime")
    except ConfigError as error:
        assert str(error)
        return
    for argument in (*plan.mpirun, *plan.data_command, *plan.data_env.values()):
        assert executable(argument), argument


other_files = st.one_of(
    st.none(),
    st.tuples(
        st.fixed_dictionaries(
            {},
            optional={
                "LocalPath": st.sampled_from(["/opt/ml/checkpoints", "relative", "/a\x00b"])
                | texts,
                "entry_script": st.sampled_from(["train.py", "run.sh"]) | json_values,
                "source_dir": st.sampled_from(["/opt/ml/input/data/code", "src.tar.gz"])
                | json_values,
                "command": json_values,
                "requirements": json_values,
                "process_count_per_node": st.sampled_from([1, 2, 0, -1, True, 1.5]) | json_values,
                "mpi_additional_options": st.sampled_from([["-x", "A=1"]]) | json_values,
                "smp": json_values,
            },
        ),
        styles,
    ).map(lambda p: as_bytes(*p)),
    hostile_files,
)


@example(
    checkpoint=b'{"LocalPath": "/opt/ml/check\\u0000points"}',
    tensorboard=None,
    source=None,
    distributed=None,
)
@example(checkpoint=None, tensorboard=None, source=DEEP.encode(), distributed=None)
@fuzz(
    "checkpointconfig.json, tensorboardoutputconfig.json, sourcecode.json, distributed.json",
    max_examples=150,
    checkpoint=other_files,
    tensorboard=other_files,
    source=other_files,
    distributed=other_files,
)
def test_the_other_config_files_are_read_or_refused(
    tmp_path, checkpoint, tensorboard, source, distributed
):
    paths = MlPaths(tmp_path)
    write(paths.checkpoint_config, checkpoint)
    write(paths.tensorboard_config, tensorboard)
    write(paths.channel("sm_drivers") / "sourcecode.json", source)
    write(paths.channel("sm_drivers") / "distributed.json", distributed)
    try:
        configured = configured_paths(tmp_path)
        code = read_source_code(paths)
    except ConfigError as error:
        assert str(error)
        return
    for folder in (configured.checkpoint_dir, configured.tensorboard_dir):
        assert folder.is_absolute() and executable(str(folder))
    if code is not None:
        assert all(
            executable(text)
            for text in (code.entry_script, code.command, code.requirements, *code.mpi_options)
        )


TRAIN = Path(sys.executable).with_name("train")


@pytest.mark.parametrize(
    "file, content",
    [
        ("resourceconfig.json", DEEP),
        ("hyperparameters.json", json.dumps({"learning_rate": "1" + "0" * 400})),
        ("hyperparameters.json", json.dumps({"sagemaker_program": "train.py", "x": "a\x00b"})),
    ],
)
def test_the_launcher_exits_2_on_what_fuzzing_found(tmp_path, file, content):
    """The real `train` on the inputs that once ended in "internal error in the launcher"."""
    paths = job_root(tmp_path, {}, program_file=True)
    (paths.config_dir / file).write_text(content)
    result = subprocess.run(
        [str(TRAIN), "--ml-root", str(paths.root)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    failure = (paths.root / "output" / "failure").read_text()
    assert failure.startswith(("hyperparameter", str(paths.config_dir))), failure
