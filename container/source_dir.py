"""The user's code from the SDK's `source_dir`: fetched and installed on every host before
any rank starts.

`Estimator(entry_point="train.py", source_dir="src/")` packs src/ as sourcedir.tar.gz, uploads
it and sets two hyperparameters: `sagemaker_submit_directory` (its URI) and `sagemaker_program`.
AWS's framework containers download and unpack it on every host and pip-install its
requirements.txt; this launcher does the same, once per host, before mpirun:

- `s3://bucket/key`: boto3 with the job's credentials (the instance role, or AWS_* variables),
  the region from `sagemaker_region` (the SDK sets it), else AWS_REGION / AWS_DEFAULT_REGION
  (resolved with the URI by job.validated, from the environment the launcher was handed),
  and the endpoint from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (boto3 reads both itself).
- `file:///path` or a plain path: a .tar.gz (any tar) or a folder.

The code folder's contents are replaced by the submit directory's: unpacked in a staging folder
first, so a failed download or a bad archive leaves no half-unpacked code behind. An archive is
unpacked by container/untar.py with what tarfile's `data` filter allows (nothing written or
linked outside the folder, no devices, no setuid bits), checked member by member against what
is already on disk, on the image's Python too. The toolkit's own `files.download_and_extract`
is not used: it unpacks without such a filter, only into an empty folder, and its errors name
neither the URI nor the fix. Every failure is a ConfigError (exit code 2) naming the URI or the
package to fix (a `sagemaker_program` missing from it is reported by the launch plan, naming
the URI too). The code folder named as its own submit directory (SageMaker local mode mounts a
local source_dir there) is used in place.

An archive's files may take at most `submit_directory_max_mb` unpacked, by default half the
space free on the code folder's disk when unpacking starts (the rest is left for pip, the model
and checkpoints): a gzip of zeros or a sparse member unpacks to a thousand times its size or
more, and the member that would pass the limit stops the job (exit code 2) before any of it is
written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from container import untar
from container.logs import log
from job.errors import ConfigError
from job.paths import MlPaths
from job.sagemaker_config import JobConfig
from job.validated import JobHyperparameters

REQUIREMENTS = "requirements.txt"


def prepare(job: JobConfig, settings: JobHyperparameters, environ: Mapping[str, str]) -> None:
    """Fetch, unpack and install the submit directory into the code folder, if the job has one:
    the URI and region job.validated resolved; `environ` is the launcher's (pip's cache)."""
    launch = settings.launch
    uri = launch.submit_directory
    if not uri:
        return
    code_dir = job.paths.code_dir
    local = local_source(uri)
    # SageMaker local mode mounts a local source_dir at /opt/ml/code and names that path: it
    # means "the code is already in the code folder", which under `train --ml-root DIR` is
    # DIR/code.
    if local is not None and (local.resolve() == code_dir.resolve() or local == MlPaths().code_dir):
        log.info(f"the submit directory {uri} is the code folder itself")
    else:
        log.info(f"fetching the submit directory {uri} into {code_dir}")
        staging = code_dir.with_name(f".{code_dir.name}-staging-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            unpack(uri, staging, settings.region, launch.submit_directory_max_mb)
            replace_contents(code_dir, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    requirements = job.source_code.requirements if job.source_code else ""
    install_requirements(code_dir, uri, requirements or REQUIREMENTS, environ)


def local_source(uri: str) -> Path | None:
    """The path a file:// URI or plain path names; None for a remote URI."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(uri) if parsed.scheme == "" else None


def unpack(uri: str, destination: Path, region_name: str | None, max_mb: int = 0) -> None:
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        archive = destination.with_name(destination.name + ".tar.gz")
        limit = unpack_limit(destination, max_mb)
        try:
            download_s3(parsed.netloc, parsed.path.lstrip("/"), archive, region_name, uri, limit)
            extract(archive, destination, uri, max_mb)
        finally:
            archive.unlink(missing_ok=True)
        return
    source = local_source(uri)
    if source is None:
        raise ConfigError(
            f"submit directory {uri!r}: scheme {parsed.scheme!r} is not "
            "supported; use s3://, file:// or a path in the container"
        )
    if source.is_dir():
        shutil.copytree(source, destination, dirs_exist_ok=True, symlinks=True)
    elif source.is_file():
        extract(source, destination, uri, max_mb)
    else:
        raise ConfigError(
            f"submit directory {uri!r}: {source} does not exist in the "
            "container; mount it there or give an s3:// URI"
        )


def download_s3(
    bucket: str,
    key: str,
    target: Path,
    region_name: str | None,
    uri: str,
    limit: tuple[int, str],
) -> None:
    """Download the archive, once its size (S3's HEAD) is known to be within `limit` (bytes,
    and where that number comes from): an archive larger than what its files may unpack to
    would only fill the disk before extraction refused it."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    if not bucket or not key:
        raise ConfigError(f"submit directory {uri!r} must be s3://bucket/key of a .tar.gz")
    max_bytes, origin = limit
    try:
        client = boto3.client("s3", region_name=region_name)
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > max_bytes:
            raise ConfigError(
                f"submit directory {uri!r} is a {size}-byte archive, more than the limit of "
                f"{max_bytes} bytes on what it unpacks to ({origin}); leave large files out "
                "of source_dir (give them as an input channel), or raise "
                "submit_directory_max_mb if the disk holds them"
            )
        client.download_file(bucket, key, str(target))
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchKey", "NoSuchBucket"):
            fix = "the object does not exist; upload it or fix sagemaker_submit_directory"
        elif code in ("403", "AccessDenied"):
            fix = (
                "access denied; give the job's role s3:GetObject on it (and kms:Decrypt "
                "if it is encrypted with a KMS key)"
            )
        else:
            fix = f"S3 answered {code}: {error}"
        raise ConfigError(f"submit directory {uri}: {fix}") from None
    except BotoCoreError as error:
        raise ConfigError(
            f"submit directory {uri}: cannot download it: {error}; check the "
            "job's credentials, region and network access to S3"
        ) from None


MB = 1024 * 1024


def unpack_limit(destination: Path, max_mb: int) -> tuple[int, str]:
    """The most bytes the submit directory may unpack to in `destination`, and where that
    number comes from, for the error: `max_mb` MB, or half the space free there (0)."""
    if max_mb:
        return max_mb * MB, f"submit_directory_max_mb={max_mb}"
    free = shutil.disk_usage(destination).free
    return free // 2, (
        f"half the {free // MB} MB free on the code folder's disk; the "
        "hyperparameter submit_directory_max_mb sets it"
    )


def extract(archive: Path, destination: Path, uri: str, max_mb: int = 0) -> None:
    """Unpack the archive into `destination`, its files at most `max_mb` MB (0: half the space
    free there); any failure is a ConfigError naming the URI, and the member if it is one."""
    max_bytes, origin = unpack_limit(destination, max_mb)
    try:
        with untar.open_archive(archive):
            pass
    except tarfile.ReadError:
        raise ConfigError(
            f"submit directory {uri!r} is not a tar archive (.tar.gz); pack "
            "the folder with `tar -czf sourcedir.tar.gz -C src .` or let the "
            "SDK pack source_dir"
        ) from None
    except (untar.RefusedMember, tarfile.TarError, OSError, EOFError, zlib.error):
        pass  # a tar archive whose first member is bad: extract says what is wrong below
    try:
        untar.extract(archive, destination, max_bytes)
    except untar.TooLarge as refused:
        raise ConfigError(
            f"submit directory {uri!r} cannot be unpacked: {refused} ({origin}); "
            "leave large files out of source_dir (give them as an input channel), "
            "or raise submit_directory_max_mb if the disk holds them"
        ) from None
    except untar.RefusedMember as refused:
        raise ConfigError(
            f"submit directory {uri!r} cannot be unpacked: {refused}; repack "
            "it as a .tar.gz of the source folder, with links that stay "
            "inside it"
        ) from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise ConfigError(
            f"submit directory {uri!r} cannot be unpacked: {error}; repack "
            "it as a .tar.gz of the source folder"
        ) from None


def replace_contents(folder: Path, staging: Path) -> None:
    """Empty `folder` (which may be a mount point, so it is kept) and move staging's entries in."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in staging.iterdir():
        shutil.move(str(entry), folder / entry.name)


WARM_POOL_CACHE = "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY"


def pip_install_command(name: str, environ: Mapping[str, str]) -> list[str]:
    """pip's command for the requirements file `name`. On a warm-pool instance SageMaker sets
    WARM_POOL_CACHE to a folder that outlives the job: pip's cache goes there, so the next job
    on the instance installs from the wheels this one downloaded or built."""
    cache = environ.get(WARM_POOL_CACHE)
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-input",
        "--disable-pip-version-check",
        *(["--cache-dir", str(Path(cache) / "pip")] if cache else []),
        "-r",
        name,
    ]


def install_requirements(code_dir: Path, uri: str, name: str, environ: Mapping[str, str]) -> None:
    """pip-install the code's requirements file (requirements.txt, or the one SDK 3's
    SourceCode names) into this host's Python, from the code folder (so relative paths in
    it, such as a bundled wheel, resolve there)."""
    if not (code_dir / name).is_file():
        return
    command = pip_install_command(name, environ)
    cached = " (pip's cache in the warm pool's folder)" if "--cache-dir" in command else ""
    log.info(f"installing {name} of the submit directory{cached}")
    result = subprocess.run(
        command, cwd=code_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    print(result.stdout, end="", flush=True)
    if result.returncode:
        errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
        cause = "; ".join(errors[-2:]) or result.stdout.strip()[-400:]
        raise ConfigError(
            f"pip could not install {name} of submit directory {uri}: "
            f"{cause}; fix the requirement or make the package reachable from "
            "the container (a wheel in source_dir, or a reachable index)"
        )
