import pytest

from job.errors import ConfigError
from job.hyperparameters import describe, parse
from job.launch_config import LaunchConfig, split_hyperparameters
from job.trainer_config import TrainerConfig


@pytest.mark.parametrize(
    "raw, expected", [("0.1", 0.1), (0.1, 0.1), ("1e-3", 0.001), ('"0.5"', None), ("3", 3.0)]
)
def test_float_forms(raw, expected):
    if expected is None:  # a JSON string is not a number
        with pytest.raises(ConfigError, match="learning_rate"):
            parse(TrainerConfig, {"learning_rate": raw})
    else:
        assert parse(TrainerConfig, {"learning_rate": raw})[0].learning_rate == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("true", True),
        ("True", True),
        (True, True),
        ('"true"', True),
        ("1", True),
        ("false", False),
        ("False", False),
        ("no", False),
        ("0", False),
    ],
)
def test_bool_forms(raw, expected):
    assert parse(TrainerConfig, {"fp16_allreduce": raw})[0].fp16_allreduce is expected


@pytest.mark.parametrize("raw", ["adam", '"adam"', "'adam'"])
def test_string_forms(raw):
    if raw == "'adam'":
        with pytest.raises(
            ConfigError, match="optimizer=\"'adam'\" is invalid: expected one of adam, sgd"
        ):
            parse(TrainerConfig, {"optimizer": raw})
    else:
        assert parse(TrainerConfig, {"optimizer": raw})[0].optimizer == "adam"


def test_int_accepts_integral_float_and_rejects_fraction():
    assert parse(TrainerConfig, {"epochs": "10.0"})[0].epochs == 10
    with pytest.raises(ConfigError, match=r"epochs='2.5' is invalid: expected an integer >= 1"):
        parse(TrainerConfig, {"epochs": "2.5"})


@pytest.mark.parametrize(
    "key, raw, message",
    [
        ("epochs", "0", "epochs='0' is invalid: expected an integer >= 1 and <= 100000"),
        ("epochs", "ten", "epochs='ten' is invalid: expected an integer"),
        (
            "dropout_rate",
            "1.5",
            "dropout_rate='1.5' is invalid: expected a number >= 0.0 and <= 0.9",
        ),
        ("learning_rate", "NaN", "learning_rate='NaN' is invalid"),
        ("fp16_allreduce", "maybe", "fp16_allreduce='maybe' is invalid: expected true or false"),
        ("model", "resnet", "model='resnet' is invalid: expected one of mlp, cnn"),
        ("epochs", "true", "epochs='true' is invalid"),
        ("hidden_units", "256,x", "hidden_units='256,x' is invalid: expected comma-separated"),
        ("image_shape", "8,8", "image_shape='8,8' is invalid: expected H,W,C"),
        ("profile_steps", "30,20", "profile_steps='30,20' is invalid: expected the first and last"),
        ("profile_steps", "20", "profile_steps='20' is invalid: expected the first and last"),
    ],
)
def test_bad_values_name_key_and_allowed(key, raw, message):
    with pytest.raises(ConfigError) as error:
        parse(TrainerConfig, {key: raw})
    assert message in str(error.value)


def test_unknown_names_are_listed_with_valid_ones():
    with pytest.raises(ConfigError) as error:
        parse(TrainerConfig, {"epoch": "3", "lr": "0.1"})
    text = str(error.value)
    assert "unknown hyperparameter(s) epoch, lr" in text
    assert "valid names are:" in text and "epochs" in text and "learning_rate" in text


def test_aliases_and_conflicts():
    launch, user, ignored = split_hyperparameters(
        {
            "sagemaker_mpi_num_of_processes_per_host": "4",
            "sagemaker_job_name": '"x"',
            "sagemaker_region": '"us-east-1"',
            "epochs": "3",
        }
    )
    assert launch.processes_per_host == 4
    assert user == {"epochs": "3"}
    assert ignored == ("sagemaker_job_name", "sagemaker_region")
    with pytest.raises(ConfigError, match="disagree"):
        split_hyperparameters(
            {"processes_per_host": "2", "sagemaker_mpi_num_of_processes_per_host": "4"}
        )


def test_describe_covers_every_field_with_defaults_that_parse():
    for cls in (TrainerConfig, LaunchConfig):
        spec = describe(cls)
        assert {s["name"] for s in spec} == set(cls.__dataclass_fields__)
        defaults = {s["name"]: str(s["default"]) for s in spec}
        assert parse(cls, defaults)[0] == cls()
