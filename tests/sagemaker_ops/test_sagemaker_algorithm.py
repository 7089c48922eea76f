"""CreateAlgorithm: generated from the container's definitions, and they round-trip through parse."""

from __future__ import annotations

import math

import pytest
from sagemaker_testing import IMAGE, botocore_accepts, dry_run

from job.errors import ConfigError
from job.hyperparameters import describe, parse
from job.launch_config import OWN_CODE, LaunchConfig
from job.trainer_config import TrainerConfig
from sagemaker_ops import builders as b
from sagemaker_ops import capabilities as cap
from sagemaker_ops import metrics, schema
from sagemaker_ops.hyperparameters import _spec, supported_hyperparameters

CONFIGS = (TrainerConfig, LaunchConfig)
SPECS = supported_hyperparameters()
OWNER = {info["name"]: cls for cls in CONFIGS for info in describe(cls)}


def spec_id(spec):
    return spec["Name"]


def test_request_fits_the_schema_and_says_what_the_trainer_accepts():
    request = b.algorithm_request(b.Algorithm(name="horovod-keras", image=IMAGE))
    botocore_accepts("CreateAlgorithm", request)
    training = request["TrainingSpecification"]
    assert training["SupportsDistributedTraining"] is True
    assert training["MetricDefinitions"] == metrics.definitions()
    data_types = [
        "text/csv",
        "application/x-npz",
        "application/x-tfrecord",
        "application/x-image",
        "image/jpeg",
        "image/png",
    ]
    assert {
        c["Name"]: (c["IsRequired"], c["SupportedContentTypes"], c["SupportedInputModes"])
        for c in training["TrainingChannels"]
    } == {
        "train": (True, data_types, ["File", "FastFile"]),
        "validation": (False, data_types, ["File", "FastFile"]),
        "weights": (False, data_types, ["File", "FastFile"]),
    }
    assert {o["MetricName"] for o in training["SupportedTuningJobObjectiveMetrics"]} == {
        "train:loss",
        "train:accuracy",
        "validation:loss",
        "validation:accuracy",
    }
    inference = request["InferenceSpecification"]
    assert inference["Containers"] == [{"Image": IMAGE}]
    assert set(inference["SupportedContentTypes"]) == {
        "application/json",
        "text/csv",
        "application/jsonlines",
        "application/x-npy",
    }
    assert inference["SupportedResponseMIMETypes"] == inference["SupportedContentTypes"]


def test_instance_types_cover_cpu_and_gpu_and_are_valid_names():
    request = b.algorithm_request(b.Algorithm(name="horovod-keras", image=IMAGE))
    training = request["TrainingSpecification"]["SupportedTrainingInstanceTypes"]
    assert set(cap.CPU_TRAINING_INSTANCE_TYPES) <= set(training)
    assert set(cap.GPU_TRAINING_INSTANCE_TYPES) <= set(training)
    assert set(training) <= set(schema.enum("TrainingInstanceType"))
    assert set(cap.REALTIME_INSTANCE_TYPES) <= set(schema.enum("ProductionVariantInstanceType"))
    assert set(cap.TRANSFORM_INSTANCE_TYPES) <= set(schema.enum("TransformInstanceType"))


def test_image_digest_pins_both_images():
    digest = "sha256:" + "ab" * 32
    request = b.algorithm_request(b.Algorithm("horovod-keras", IMAGE, image_digest=digest))
    assert request["TrainingSpecification"]["TrainingImageDigest"] == digest
    assert request["InferenceSpecification"]["Containers"][0]["ImageDigest"] == digest


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(name="horovod_keras"), "AlgorithmName: 'horovod_keras' does not match"),
        (
            dict(training_instance_types=("ml.m5.xlarge", "ml.m5.huge")),
            "SupportedTrainingInstanceTypes[1]: 'ml.m5.huge' is not valid",
        ),
        (
            dict(transform_instance_types=("ml.t2.medium",)),
            "SupportedTransformInstanceTypes[0]: 'ml.t2.medium' is not valid",
        ),
        (dict(description="x" * 1025), "AlgorithmDescription: 1025 characters; at most 1024"),
        (dict(image_digest="sha256:short"), "TrainingImageDigest: 'sha256:short' does not match"),
    ],
)
def test_bad_algorithm_refused(change, message):
    with pytest.raises(ConfigError) as refused:
        b.algorithm_request(b.Algorithm(**{"name": "horovod-keras", "image": IMAGE, **change}))
    assert message in str(refused.value)


def test_every_hyperparameter_is_generated_once_from_its_definition():
    names = [s["Name"] for s in SPECS]
    assert len(names) == len(set(names))
    assert names == [i["name"] for cls in CONFIGS for i in describe(cls)]
    for spec in SPECS:
        info = next(i for i in describe(OWNER[spec["Name"]]) if i["name"] == spec["Name"])
        assert spec["Description"] == info["help"]
        assert spec["IsRequired"] is False
        expected = {
            "int": "Integer",
            "float": "Continuous",
            "bool": "Categorical",
            "str": "Categorical" if info["choices"] else "FreeText",
        }[info["type"]]
        assert spec["Type"] == expected
        assert spec["IsTunable"] == (
            OWNER[spec["Name"]] is TrainerConfig and expected != "FreeText"
        )


def test_defaults_pass_the_trainers_own_parse():
    for cls in CONFIGS:
        defaults = {s["Name"]: s["DefaultValue"] for s in SPECS if OWNER[s["Name"]] is cls}
        parsed, unknown = parse(cls, defaults)
        assert unknown == {} and parsed == cls()


def _below(kind: str, value: str) -> str:
    return (
        str(int(value) - 1) if kind == "Integer" else repr(math.nextafter(float(value), -math.inf))
    )


def _above(kind: str, value: str) -> str:
    return (
        str(int(value) + 1) if kind == "Integer" else repr(math.nextafter(float(value), math.inf))
    )


RANGED = [s for s in SPECS if s["Type"] in ("Integer", "Continuous")]


# What a value needs beside it to be valid at all: the model axis exists on JAX only.
NEEDS = {"model_parallel": {"backend": "jax"}}


@pytest.mark.parametrize("spec", RANGED, ids=spec_id)
def test_numeric_range_is_exactly_what_parse_accepts(spec):
    cls = OWNER[spec["Name"]]
    bounds = next(iter(spec["Range"].values()))
    low, high = bounds["MinValue"], bounds["MaxValue"]
    context = NEEDS.get(spec["Name"], {})
    for accepted in (low, high, spec["DefaultValue"]):
        parse(cls, {**context, spec["Name"]: accepted})
    for rejected in (_below(spec["Type"], low), _above(spec["Type"], high)):
        with pytest.raises(ConfigError, match=f"hyperparameter {spec['Name']}="):
            parse(cls, {**context, spec["Name"]: rejected})


CATEGORICAL = [s for s in SPECS if s["Type"] == "Categorical"]


@pytest.mark.parametrize("spec", CATEGORICAL, ids=spec_id)
def test_categorical_values_are_exactly_what_parse_accepts(spec):
    cls = OWNER[spec["Name"]]
    values = spec["Range"]["CategoricalParameterRangeSpecification"]["Values"]
    assert spec["DefaultValue"] in values
    for value in values:
        parse(cls, {spec["Name"]: value})
    with pytest.raises(ConfigError, match=f"hyperparameter {spec['Name']}="):
        parse(cls, {spec["Name"]: "not-one-of-them"})


def test_free_text_defaults_parse_and_have_no_range():
    free = [s for s in SPECS if s["Type"] == "FreeText"]
    assert {s["Name"] for s in free} >= {"hidden_units", "mpi_options", "program"}
    for spec in free:
        assert "Range" not in spec
        parse(OWNER[spec["Name"]], {spec["Name"]: spec["DefaultValue"]})


def test_long_help_is_shortened_to_sagemakers_limit():
    info = {
        "name": "x",
        "type": "float",
        "default": 0.5,
        "minimum": 0.0,
        "maximum": 1.0,
        "choices": None,
        "aliases": [],
        "help": "word " * 400,
    }
    spec = _spec(info, tunable=True)
    assert len(spec["Description"]) == 1024 and spec["Description"].endswith("…")
    assert spec["Range"] == {
        "ContinuousParameterRangeSpecification": {"MinValue": "0.0", "MaxValue": "1.0"}
    }


def test_cli_register_dry_run(capsys, no_clients):
    [step] = dry_run(
        capsys,
        no_clients,
        [
            "register",
            "--algorithm-name",
            "horovod-keras",
            "--image",
            IMAGE,
            "--training-instance-type",
            "ml.c5.4xlarge",
            "--training-instance-type",
            "ml.g5.xlarge",
        ],
    )
    assert step["operation"] == "CreateAlgorithm"
    assert step["request"]["TrainingSpecification"]["SupportedTrainingInstanceTypes"] == [
        "ml.c5.4xlarge",
        "ml.g5.xlarge",
    ]
    assert step["request"]["TrainingSpecification"]["SupportedHyperParameters"] == SPECS


def test_no_script_mode_offers_nothing_that_runs_a_buyers_code(capsys, no_clients):
    [step] = dry_run(
        capsys,
        no_clients,
        ["register", "--algorithm-name", "horovod-keras", "--image", IMAGE, "--no-script-mode"],
    )
    assert step["operation"] == "CreateAlgorithm"
    offered = [
        s["Name"] for s in step["request"]["TrainingSpecification"]["SupportedHyperParameters"]
    ]
    assert set(OWN_CODE) == {"program", "submit_directory", "mpi_options"}
    assert offered == [s["Name"] for s in SPECS if s["Name"] not in OWN_CODE]
    assert {"processes_per_host", "epochs", "learning_rate"} <= set(offered)
