"""The SDK's source_dir: `sagemaker_submit_directory` fetched into /opt/ml/code on each host
before any rank starts, and every way it can be wrong. Runs the real `train --dry-run` (which
fetches and installs exactly as a real launch does, then prints the plan) against a real S3
API server on loopback."""

import io
import shutil
import json
import os
import subprocess
import sys
import tarfile
import uuid

import pytest

from tests.conftest import TRAIN
from tests.s3_server import s3_server, start_moto, uninstall, write_wheel  # noqa: F401

SCRIPT = "print('hello from source_dir')\n"


def pack(folder, target):
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return target


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "src"
    (folder / "lib").mkdir(parents=True)
    (folder / "train.py").write_text(SCRIPT)
    (folder / "lib" / "helpers.py").write_text("VALUE = 1\n")
    return folder


def dry_run(root, env=None):
    result = subprocess.run([str(TRAIN), "--ml-root", str(root), "--dry-run"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, **(env or {})})
    return result


def job(make_job, uri, program="train.py", **hyperparameters):
    values = {"sagemaker_submit_directory": json.dumps(uri), **hyperparameters}
    if program:
        values["sagemaker_program"] = json.dumps(program)
    return make_job(values)


def assert_fetched(root, result):
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout[result.stdout.index("{"):])
    assert plan["mode"] == "script" and plan["program"] == "train.py"
    assert (root / "code" / "train.py").read_text() == SCRIPT
    assert (root / "code" / "lib" / "helpers.py").read_text() == "VALUE = 1\n"


def test_a_local_folder(make_job, source):
    root = job(make_job, str(source))
    (root / "code").mkdir()
    (root / "code" / "stale.py").write_text("left from an earlier job")
    result = dry_run(root)
    assert_fetched(root, result)
    assert not (root / "code" / "stale.py").exists()


def test_a_file_uri_of_a_tar_gz(make_job, source, tmp_path):
    root = job(make_job, f"file://{pack(source, tmp_path / 'sourcedir.tar.gz')}")
    assert_fetched(root, dry_run(root))


@pytest.mark.parametrize("endpoint_variable", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
def test_an_s3_object_through_the_endpoint_and_region_of_the_job(make_job, source, tmp_path,
                                                                   s3_server, endpoint_variable):
    uri = s3_server.upload("sm11-jobs", "job-1/source/sourcedir.tar.gz",
                           pack(source, tmp_path / "sourcedir.tar.gz"))
    root = job(make_job, uri, sagemaker_region=json.dumps("eu-west-1"))
    env = s3_server.environment()
    env[endpoint_variable] = env.pop("AWS_ENDPOINT_URL_S3")
    assert_fetched(root, dry_run(root, env))


def test_the_environment_variable_and_requirements_installed_once(make_job, source, tmp_path):
    package = f"sm11_probe_{uuid.uuid4().hex[:8]}"
    wheel = write_wheel(source / "wheels", package, "1.0", "GREETING = 'hi'\n")
    (source / "requirements.txt").write_text(f"./wheels/{wheel.name}\n")
    root = make_job({"sagemaker_program": "train.py"})
    try:
        result = dry_run(root, {"SAGEMAKER_SUBMIT_DIRECTORY": str(source)})
        assert_fetched(root, result)
        imported = subprocess.run([sys.executable, "-c", f"import {package}; "
                                   f"print({package}.GREETING)"], capture_output=True, text=True)
        assert imported.stdout.strip() == "hi", imported.stderr
    finally:
        uninstall(package)


def expect_config_error(root, *fragments, env=None):
    result = dry_run(root, env)
    assert result.returncode == 2, result.stdout[-1000:] + result.stderr[-2000:]
    reason = result.stderr.split("job FAILED (exit code 2): ", 1)[1]  # --dry-run: not in the failure file
    for fragment in fragments:
        assert fragment in reason, reason
    assert "Traceback" not in result.stderr


def test_a_missing_s3_object(make_job, s3_server, source, tmp_path):
    s3_server.upload("sm11-jobs", "other", pack(source, tmp_path / "s.tar.gz"))
    uri = "s3://sm11-jobs/job-2/source/sourcedir.tar.gz"
    expect_config_error(job(make_job, uri), f"submit directory {uri}: the object does not exist",
                        env=s3_server.environment())


def test_access_denied(make_job, source, tmp_path):
    """An S3 server that checks credentials (moto's IAM enforcement): the job's user may not
    read the object."""
    from tests.s3_server import S3Server, free_port

    port = free_port()
    # The first three calls (create user, access key, upload) are let through unauthorised.
    server = start_moto(port, INITIAL_NO_AUTH_ACTION_COUNT="4")
    try:
        s3 = S3Server(f"http://127.0.0.1:{port}")
        import boto3

        iam = boto3.client("iam", endpoint_url=s3.endpoint, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        iam.create_user(UserName="job-role")
        key = iam.create_access_key(UserName="job-role")["AccessKey"]
        client = s3.client()
        client.create_bucket(Bucket="sm11-private")
        client.upload_file(str(pack(source, tmp_path / "s.tar.gz")), "sm11-private", "s.tar.gz")
        env = {**s3.environment(), "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
               "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        expect_config_error(job(make_job, "s3://sm11-private/s.tar.gz"),
                            "submit directory s3://sm11-private/s.tar.gz: access denied",
                            "s3:GetObject", env=env)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_not_an_archive(make_job, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    uri = f"file://{tmp_path / 'train.py'}"
    expect_config_error(job(make_job, uri), f"submit directory {uri!r} is not a tar archive")


def test_a_missing_local_path(make_job, tmp_path):
    expect_config_error(job(make_job, str(tmp_path / "nowhere.tar.gz")),
                        "does not exist in the container")


def test_an_unsupported_scheme(make_job):
    expect_config_error(job(make_job, "https://example.invalid/s.tar.gz"),
                        "scheme 'https' is not supported")


def test_the_program_is_not_in_it(make_job, source):
    expect_config_error(job(make_job, str(source), program="main.py"),
                        f"program 'main.py' is not in submit directory {source}")


def test_a_program_outside_the_code_folder(make_job):
    root = make_job({"sagemaker_program": "../escape.py"})
    (root / "escape.py").write_text(SCRIPT)
    expect_config_error(root, "program '../escape.py' points outside the code folder")


def test_an_archive_member_escaping_the_folder(make_job, tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"print('escaped')\n"
        member = tarfile.TarInfo("../escaped.py")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    root = job(make_job, str(archive))
    expect_config_error(root, "cannot be unpacked")
    assert not (root / "escaped.py").exists() and not any((root / "code").glob("*"))


def test_a_requirement_that_fails_to_install(make_job, source):
    (source / "requirements.txt").write_text("--no-index\nsm11-no-such-package==1.0\n")
    expect_config_error(job(make_job, str(source)), "pip could not install requirements.txt",
                        "sm11-no-such-package")


@pytest.mark.parametrize("named", ["file://{code}", "/opt/ml/code"],
                         ids=["the code folder's own path", "the SDK's container path"])
def test_the_code_folder_itself_as_in_local_mode(make_job, source, named):
    """SageMaker local mode mounts source_dir at /opt/ml/code and names that folder; under
    `train --ml-root DIR` the code folder is DIR/code, and /opt/ml/code still means it."""
    root = make_job({"sagemaker_program": "train.py"})
    shutil.copytree(source, root / "code")
    (root / "code" / "requirements.txt").write_text("--no-index\nsm11-no-such-package==1.0\n")
    values = {"sagemaker_submit_directory": json.dumps(named.format(code=root / "code"))}
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(
        {**json.loads((root / "input" / "config" / "hyperparameters.json").read_text()),
         **values}))
    result = dry_run(root)
    assert "is the code folder itself" in result.stdout
    assert (root / "code" / "train.py").read_text() == SCRIPT  # left in place, not emptied
    assert result.returncode == 2 and "sm11-no-such-package" in result.stderr  # still installed


@pytest.mark.parametrize("name, kind, link", [
    ("/tmp/sm11-absolute.py", tarfile.REGTYPE, ""),
    ("link", tarfile.SYMTYPE, "../../outside"),
    ("hard", tarfile.LNKTYPE, "/etc/passwd"),
    ("device", tarfile.CHRTYPE, ""),
])
def test_archive_members_that_are_refused(make_job, tmp_path, name, kind, link):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        member = tarfile.TarInfo(name)
        member.type, member.linkname = kind, link
        tar.addfile(member, io.BytesIO(b""))
    root = job(make_job, str(archive))
    expect_config_error(root, f"cannot be unpacked: member {name!r} would land outside")
    assert not any((root / "code").glob("*"))
