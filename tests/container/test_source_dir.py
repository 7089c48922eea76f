"""The SDK's source_dir: `sagemaker_submit_directory` fetched into /opt/ml/code on each host
before any rank starts, and every way it can be wrong. Runs the real `train --dry-run` (which
fetches and installs exactly as a real launch does, then prints the plan) against a real S3
API server on loopback."""

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import uuid

import pytest

from container.source_dir import WARM_POOL_CACHE, extract, pip_install_command, prepare
from job.errors import ConfigError
from job.paths import MlPaths
from job.sagemaker_config import JobConfig, ResourceConfig
from job.validated import validate_hyperparameters
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
    result = subprocess.run(
        [str(TRAIN), "--ml-root", str(root), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    return result


def job(make_job, uri, program="train.py", **hyperparameters):
    values = {"sagemaker_submit_directory": json.dumps(uri), **hyperparameters}
    if program:
        values["sagemaker_program"] = json.dumps(program)
    return make_job(values)


def assert_fetched(root, result):
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout[result.stdout.index("{") :])
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
def test_an_s3_object_through_the_endpoint_and_region_of_the_job(
    make_job, source, tmp_path, s3_server, endpoint_variable
):
    uri = s3_server.upload(
        "sm11-jobs", "job-1/source/sourcedir.tar.gz", pack(source, tmp_path / "sourcedir.tar.gz")
    )
    root = job(make_job, uri, sagemaker_region=json.dumps("eu-west-1"))
    env = s3_server.environment()
    env[endpoint_variable] = env.pop("AWS_ENDPOINT_URL_S3")
    assert_fetched(root, dry_run(root, env))


def test_the_environment_variable_and_requirements_installed_once(make_job, source, tmp_path):
    package = f"sm11_probe_{uuid.uuid4().hex[:8]}"
    wheel = write_wheel(source / "wheels", package, "1.0", "GREETING = 'hi'\n")
    (source / "requirements.txt").write_text(f"./wheels/{wheel.name}\n")
    root = make_job({"sagemaker_program": "train.py"})
    cache = tmp_path / "warm-pool-cache"  # SageMaker's folder that outlives a warm-pool job
    try:
        result = dry_run(
            root, {"SAGEMAKER_SUBMIT_DIRECTORY": str(source), WARM_POOL_CACHE: str(cache)}
        )
        assert_fetched(root, result)
        assert (
            "installing requirements.txt of the submit directory (pip's cache in the warm "
            "pool's folder)"
        ) in result.stdout
        imported = subprocess.run(
            [sys.executable, "-c", f"import {package}; print({package}.GREETING)"],
            capture_output=True,
            text=True,
        )
        assert imported.stdout.strip() == "hi", imported.stderr
    finally:
        uninstall(package)


def test_the_submit_directory_comes_from_the_validated_job_not_the_process_environment(
    tmp_path, source, monkeypatch
):
    """prepare fetches what validation resolved from the environment the launcher was handed,
    as make_plan plans with it: the process's own SAGEMAKER_SUBMIT_DIRECTORY is not read."""
    monkeypatch.setenv("SAGEMAKER_SUBMIT_DIRECTORY", str(tmp_path / "elsewhere"))
    paths = MlPaths(tmp_path / "ml")
    job = JobConfig(paths, ResourceConfig("algo-1", ("algo-1",)), {}, {})
    settings = validate_hyperparameters(
        {"sagemaker_program": "train.py"}, {"SAGEMAKER_SUBMIT_DIRECTORY": str(source)}
    )
    prepare(job, settings, {})
    assert (paths.code_dir / "train.py").read_text() == SCRIPT


def test_pip_keeps_its_cache_in_the_warm_pool_folder_only_when_sagemaker_gives_one():
    assert pip_install_command("requirements.txt", {})[-5:] == [
        "install",
        "--no-input",
        "--disable-pip-version-check",
        "-r",
        "requirements.txt",
    ]
    warm = pip_install_command("reqs.txt", {WARM_POOL_CACHE: "/opt/ml/sagemaker/warmpoolcache"})
    assert warm[warm.index("--cache-dir") + 1] == "/opt/ml/sagemaker/warmpoolcache/pip"
    assert warm[-2:] == ["-r", "reqs.txt"]


def expect_config_error(root, *fragments, env=None):
    result = dry_run(root, env)
    assert result.returncode == 2, result.stdout[-1000:] + result.stderr[-2000:]
    reason = result.stderr.split("job FAILED (exit code 2): ", 1)[
        1
    ]  # --dry-run: not in the failure file
    for fragment in fragments:
        assert fragment in reason, reason
    assert "Traceback" not in result.stderr


def test_a_missing_s3_object(make_job, s3_server, source, tmp_path):
    s3_server.upload("sm11-jobs", "other", pack(source, tmp_path / "s.tar.gz"))
    uri = "s3://sm11-jobs/job-2/source/sourcedir.tar.gz"
    expect_config_error(
        job(make_job, uri),
        f"submit directory {uri}: the object does not exist",
        env=s3_server.environment(),
    )


def test_an_s3_archive_larger_than_the_unpack_limit_is_not_downloaded(
    make_job, s3_server, source, tmp_path
):
    """2 MiB of random bytes (gzip cannot shrink them) against submit_directory_max_mb=1: S3's
    HEAD says the archive alone passes the limit, so nothing is downloaded or unpacked."""
    (source / "noise.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    uri = s3_server.upload("sm11-jobs", "job-3/sourcedir.tar.gz", pack(source, tmp_path / "n.tgz"))
    root = job(make_job, uri, submit_directory_max_mb="1")
    expect_config_error(
        root,
        f"submit directory {uri!r} is a ",
        "-byte archive, more than the limit of 1048576 bytes on what it unpacks to "
        "(submit_directory_max_mb=1)",
        env=s3_server.environment(),
    )
    assert not (root / "code" / "noise.bin").exists()


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

        iam = boto3.client(
            "iam",
            endpoint_url=s3.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        iam.create_user(UserName="job-role")
        key = iam.create_access_key(UserName="job-role")["AccessKey"]
        client = s3.client()
        client.create_bucket(Bucket="sm11-private")
        client.upload_file(str(pack(source, tmp_path / "s.tar.gz")), "sm11-private", "s.tar.gz")
        env = {
            **s3.environment(),
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
        expect_config_error(
            job(make_job, "s3://sm11-private/s.tar.gz"),
            "submit directory s3://sm11-private/s.tar.gz: access denied",
            "s3:GetObject",
            env=env,
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_not_an_archive(make_job, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    uri = f"file://{tmp_path / 'train.py'}"
    expect_config_error(job(make_job, uri), f"submit directory {uri!r} is not a tar archive")


def test_a_missing_local_path(make_job, tmp_path):
    expect_config_error(
        job(make_job, str(tmp_path / "nowhere.tar.gz")), "does not exist in the container"
    )


def test_an_unsupported_scheme(make_job):
    expect_config_error(
        job(make_job, "https://example.invalid/s.tar.gz"), "scheme 'https' is not supported"
    )


def test_the_program_is_not_in_it(make_job, source):
    expect_config_error(
        job(make_job, str(source), program="main.py"),
        f"program 'main.py' is not in submit directory {source}",
    )


def test_a_program_outside_the_code_folder(make_job):
    root = make_job({"sagemaker_program": "../escape.py"})
    (root / "escape.py").write_text(SCRIPT)
    expect_config_error(root, "program '../escape.py' points outside the code folder")


def test_a_requirement_that_fails_to_install(make_job, source):
    (source / "requirements.txt").write_text("--no-index\nsm11-no-such-package==1.0\n")
    expect_config_error(
        job(make_job, str(source)), "pip could not install requirements.txt", "sm11-no-such-package"
    )


@pytest.mark.parametrize(
    "named",
    ["file://{code}", "/opt/ml/code"],
    ids=["the code folder's own path", "the SDK's container path"],
)
def test_the_code_folder_itself_as_in_local_mode(make_job, source, named):
    """SageMaker local mode mounts source_dir at /opt/ml/code and names that folder; under
    `train --ml-root DIR` the code folder is DIR/code, and /opt/ml/code still means it."""
    root = make_job({"sagemaker_program": "train.py"})
    shutil.copytree(source, root / "code")
    (root / "code" / "requirements.txt").write_text("--no-index\nsm11-no-such-package==1.0\n")
    values = {"sagemaker_submit_directory": json.dumps(named.format(code=root / "code"))}
    (root / "input" / "config" / "hyperparameters.json").write_text(
        json.dumps(
            {
                **json.loads((root / "input" / "config" / "hyperparameters.json").read_text()),
                **values,
            }
        )
    )
    result = dry_run(root)
    assert "is the code folder itself" in result.stdout
    assert (root / "code" / "train.py").read_text() == SCRIPT  # left in place, not emptied
    assert result.returncode == 2 and "sm11-no-such-package" in result.stderr  # still installed


# Crafted archives. Each member is (name, type, link target or file data, mode), written in
# order by tarfile; unpacked by the launcher's own extract into tmp_path/a/b/c/staging, three
# folders below a file that must stay as it is, so a write up to four levels up is seen.


def entry(name, kind=tarfile.REGTYPE, value="", mode=0o644):
    return name, kind, value, mode


def craft(target, *entries):
    with tarfile.open(target, "w:gz") as tar:
        for name, kind, value, mode in entries:
            member = tarfile.TarInfo(name)
            member.type, member.mode = kind, mode
            data = b""
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                member.linkname = value
            else:
                data = value.encode()
            member.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(member, io.BytesIO(data))
    return target


@pytest.fixture
def unpack_into(tmp_path):
    """unpack_into(*entries) -> the staging folder the crafted archive was unpacked into;
    raises what the launcher raises."""
    staging = tmp_path / "a" / "b" / "c" / "staging"
    staging.mkdir(parents=True)
    (tmp_path / "a" / "outside.txt").write_text("kept")

    def unpack(*entries):
        archive = craft(tmp_path / "crafted.tar.gz", *entries)
        extract(archive, staging, "s3://sm11-jobs/crafted.tar.gz")
        return staging

    return unpack


def outside_of(tmp_path):
    """Every path under tmp_path but the staging folder and the archive, with what a file
    holds."""
    staging = tmp_path / "a" / "b" / "c" / "staging"
    return {
        str(path.relative_to(tmp_path)): path.read_bytes()
        if path.is_file() and not path.is_symlink()
        else None
        for path in tmp_path.rglob("*")
        if staging not in (path, *path.parents) and path.name != "crafted.tar.gz"
    }


# The CPython test of CVE-2025-4517 (gh-135034): folders with names so long that the path
# with the links followed is longer than PATH_MAX, where os.path.realpath stops following.
def past_path_max(staging_length):
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf("/", "PC_PATH_MAX") - staging_length - 1) // (len(steps) + 1))
    entries, path = [], ""
    for step in steps:
        entries += [
            entry(os.path.join(path, component), tarfile.DIRTYPE, mode=0o777),
            entry(os.path.join(path, step), tarfile.SYMTYPE, component),
        ]
        path = os.path.join(path, component)
    top = os.path.join(*steps, "l" * 254)
    return [
        *entries,
        entry(top, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps))),
        entry("escape", tarfile.SYMTYPE, os.path.join(top, "..")),
        entry("escape/newfile", value="new"),
    ]


REFUSED = {
    "a link chain (l2 -> l1/.. with l1 -> .)": (
        [
            entry("l1", tarfile.SYMTYPE, "."),
            entry("l2", tarfile.SYMTYPE, "l1/.."),
            entry("l2/x", value="escaped"),
        ],
        "member 'l2' is a symbolic link to 'l1/..', which leads outside the folder, to ..",
    ),
    "a deeper chain, three levels up": (
        [
            entry("l1", tarfile.SYMTYPE, "."),
            entry("l2", tarfile.SYMTYPE, "l1/.."),
            entry("l3", tarfile.SYMTYPE, "l2/.."),
            entry("l4", tarfile.SYMTYPE, "l3/.."),
            entry("l4/x", value="escaped"),
        ],
        "member 'l2' is a symbolic link to 'l1/..', which leads outside the folder, to ..",
    ),
    "a deeper chain inside subfolders": (
        [
            entry("l1", tarfile.SYMTYPE, "."),
            entry("d/e/f", tarfile.DIRTYPE),
            entry("d/e/f/up1", tarfile.SYMTYPE, "../../../l1"),
            entry("d/e/f/up2", tarfile.SYMTYPE, "up1/d/e/f/up1/.."),
            entry("d/e/f/up2/x", value="escaped"),
        ],
        "member 'd/e/f/up2' is a symbolic link to 'up1/d/e/f/up1/..', which leads outside the "
        "folder, to ..",
    ),
    "a link that leads out only once a later link exists": (
        [
            entry("l1", tarfile.SYMTYPE, "."),
            entry("x", tarfile.SYMTYPE, "m/.."),
            entry("m", tarfile.SYMTYPE, "l1"),
        ],
        "member 'x' is a symbolic link that leads outside the folder, to .., once the members "
        "after it are unpacked",
    ),
    "a member named through a symlinked folder": (
        [
            entry("l1", tarfile.SYMTYPE, "."),
            entry("x", tarfile.SYMTYPE, "m/.."),
            entry("m", tarfile.SYMTYPE, "l1"),
            entry("x/escaped.py", value="escaped"),
        ],
        "member 'x/escaped.py' would land outside the folder, at ../escaped.py",
    ),
    "names longer than PATH_MAX once links are followed (CVE-2025-4517)": (
        "past_path_max",
        "cannot be followed or written: File name too long",
    ),
    "a hard link to a file outside": (
        [
            entry("hard", tarfile.LNKTYPE, "../../../outside.txt"),
            entry("hard", value="overwritten"),
        ],
        "member 'hard' is a hard link to '../../../outside.txt', which leads outside the "
        "folder, to ../../../outside.txt",
    ),
    "a hard link to an absolute path": (
        [entry("hard", tarfile.LNKTYPE, "/etc/passwd")],
        "member 'hard' is a hard link to the absolute path '/etc/passwd'; links must be relative",
    ),
    "a hard link to a folder": (
        [entry("lib", tarfile.DIRTYPE), entry("hard", tarfile.LNKTYPE, "lib")],
        "member 'hard' is a hard link to 'lib', which is not a file unpacked before it",
    ),
    "a symlink to an absolute path": (
        [entry("etc", tarfile.SYMTYPE, "/etc"), entry("etc/sm11-escaped", value="escaped")],
        "member 'etc' is a symbolic link to the absolute path '/etc'",
    ),
    "a symlink loop": (
        [entry("p", tarfile.SYMTYPE, "q"), entry("q", tarfile.SYMTYPE, "p")],
        "member 'p' cannot be followed: Too many levels of symbolic links",
    ),
    "../x": (
        [entry("../x", value="escaped")],
        "member '../x' would land outside the folder, at ../x",
    ),
    "an absolute name": (
        [entry("/tmp/sm11-absolute.py", value="escaped")],
        "member '/tmp/sm11-absolute.py' has an absolute name",
    ),
    "a FIFO": (
        [entry("pipe", tarfile.FIFOTYPE)],
        "member 'pipe' is a FIFO; only files, folders and links can be unpacked",
    ),
    "a character device": (
        [entry("device", tarfile.CHRTYPE)],
        "member 'device' is a character device; only files, folders and links",
    ),
    "a file over a folder unpacked before it": (
        [entry("lib", tarfile.DIRTYPE), entry("lib", value="x")],
        "member 'lib' would replace the folder of that name unpacked before it",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_crafted_archive_is_refused_and_nothing_is_written_outside(tmp_path, unpack_into, case):
    entries, reason = REFUSED[case]
    if entries == "past_path_max":
        entries = past_path_max(len(str(tmp_path / "a" / "b" / "c" / "staging")))
    before = outside_of(tmp_path)
    with pytest.raises(ConfigError) as refused:
        unpack_into(*entries)
    message = str(refused.value)
    assert message.startswith(
        "submit directory 's3://sm11-jobs/crafted.tar.gz' cannot be unpacked: "
    ), message
    assert reason in message and "repack it as a .tar.gz" in message, message
    assert outside_of(tmp_path) == before
    assert not os.path.lexists("/etc/sm11-escaped") and not os.path.lexists("/tmp/sm11-absolute.py")


def test_permissions_as_the_data_filter_sets_them(unpack_into):
    staging = unpack_into(
        entry("setuid", value="#!/bin/sh\n", mode=0o4755),
        entry("setgid-group-writable", value="x", mode=0o2775),
        entry("sticky-world-writable", value="x", mode=0o1666),
        entry("no-owner-bits", value="x", mode=0o077),
        entry("lib", tarfile.DIRTYPE, mode=0o2777),
    )
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in staging.iterdir()}
    umask = os.umask(0)
    os.umask(umask)
    assert modes == {
        "setuid": 0o755,
        "setgid-group-writable": 0o755,
        "sticky-world-writable": 0o644,
        "no-owner-bits": 0o644,
        "lib": 0o777 & ~umask,
    }


def test_a_legitimate_archive_with_links_inside_it(unpack_into, tmp_path):
    before = outside_of(tmp_path)
    staging = unpack_into(
        entry("./", tarfile.DIRTYPE),
        entry("./train.py", value=SCRIPT, mode=0o755),
        entry("./lib/helpers.py", value="VALUE = 0\n"),  # its folder has no member of its own
        entry("./lib/helpers.py", value="VALUE = 1\n"),  # a later member replaces it
        entry("./lib/current", tarfile.SYMTYPE, "helpers.py"),
        entry("./lib/up", tarfile.SYMTYPE, "../train.py"),
        entry("./shared", tarfile.SYMTYPE, "lib"),
        entry("./shared/extra.py", value="EXTRA = 2\n"),  # through a link to a folder inside
        entry("./again.py", tarfile.LNKTYPE, "./shared/up"),
        entry("./data", tarfile.SYMTYPE, "not-yet"),  # dangling, inside
        entry("./lib/current", tarfile.SYMTYPE, "extra.py"),
    )  # a link replaced
    assert (staging / "train.py").read_text() == SCRIPT
    assert (staging / "lib" / "helpers.py").read_text() == "VALUE = 1\n"
    assert (staging / "lib" / "extra.py").read_text() == "EXTRA = 2\n"
    assert os.readlink(staging / "lib" / "current") == "extra.py"
    assert (staging / "lib" / "up").read_text() == SCRIPT
    assert os.readlink(staging / "shared") == "lib"
    assert (staging / "again.py").stat().st_ino == (staging / "train.py").stat().st_ino
    assert os.readlink(staging / "data") == "not-yet"
    assert outside_of(tmp_path) == before


def test_a_refused_archive_leaves_the_code_folder_as_it_was(make_job, tmp_path):
    """Through the real launcher: the link chain stops the job with exit code 2, the code
    folder keeps its files, no staging folder is left, and nothing is written beside it."""
    archive = craft(
        tmp_path / "evil.tar.gz",
        entry("train.py", value=SCRIPT),
        entry("l1", tarfile.SYMTYPE, "."),
        entry("l2", tarfile.SYMTYPE, "l1/.."),
        entry("l2/x", value="escaped"),
    )
    root = job(make_job, str(archive))
    (root / "code").mkdir()
    (root / "code" / "train.py").write_text("earlier code\n")
    before = sorted(path.name for path in root.iterdir())
    expect_config_error(
        root,
        f"submit directory {str(archive)!r} cannot be unpacked: member "
        "'l2' is a symbolic link to 'l1/..', which leads outside the folder",
    )
    assert sorted(path.name for path in root.iterdir()) == before
    assert [path.name for path in (root / "code").iterdir()] == ["train.py"]
    assert (root / "code" / "train.py").read_text() == "earlier code\n"


def test_a_time_out_of_range_is_refused_naming_the_member(tmp_path):
    member = tarfile.TarInfo("train.py")
    member.size, member.mtime = 1, 2**70  # base-256 in the header; no time_t holds it
    with tarfile.open(tmp_path / "s.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(member, io.BytesIO(b"#"))
    (tmp_path / "staging").mkdir()
    with pytest.raises(
        ConfigError, match="member 'train.py' cannot be followed or written: timestamp out of range"
    ):
        extract(tmp_path / "s.tar", tmp_path / "staging", "file:///s.tar")
