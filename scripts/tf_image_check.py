"""Run a TensorFlow 2.21 image's jobs on this machine and report the image's size.

    python scripts/tf_image_check.py IMAGE

`make build-tf-gpu` calls it after building the GPU variant, which cannot meet a GPU here:
TensorFlow and JAX fall back to the CPU, so the runs prove the image's stacks and launcher,
not CUDA. The jobs, each on 2 processes in one container, on the embedded digits:
- `make train`'s default job: the built-in trainer, tf_keras under MultiWorkerMirroredStrategy;
- a Keras 3 script in the shape of keras.io's distribution guide
  (train/examples/keras_guide_script.py): JAX's backend with keras.distribution.
Exit code: the first failing job's, else 0.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.local_cluster import Engine  # noqa: E402  (the project root is on the path now)

GUIDE = REPO / "train" / "examples" / "keras_guide_script.py"
# The lines of each job's log worth showing.
SHOWN = ("rank(s)", "METRICS", "RESULT", "launcher: job", "process ", "WEIGHTS", "ACCURACY")


def run_job(
    engine: Engine, image: str, hyperparameters: dict[str, str], script: Path | None = None
) -> int:
    """One job of 2 processes in one container of `image` (its script in /opt/ml/code)."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "ml"
        subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts" / "default_job.py"),
                "--ml-root",
                str(root),
                "--no-run",
            ],
            check=True,
            capture_output=True,
        )
        values = {"processes_per_host": "2", **hyperparameters}
        if script is not None:
            (root / "code").mkdir(exist_ok=True)
            shutil.copy(script, root / "code" / script.name)
            values["sagemaker_program"] = script.name
        (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(values))
        job = engine.run(
            "run", "--rm", "-v", f"{root}:/opt/ml", image, "train", check=False, timeout=900
        )
    print(
        "\n".join(
            line for line in job.stdout.splitlines() if any(shown in line for shown in SHOWN)
        ),
        flush=True,
    )
    if job.returncode:
        print(job.stdout[-3000:] + job.stderr[-3000:], file=sys.stderr)
    return job.returncode


def main(image: str) -> int:
    engine = Engine.detect()
    size = json.loads(engine.run("image", "inspect", image).stdout)[0]["Size"]
    print(f"tf_image_check: {image} is {size / 1e9:.2f} GB", flush=True)
    jobs = {
        "the built-in trainer (MultiWorkerMirroredStrategy)": (
            {"epochs": "3", "learning_rate": "0.002"},
            None,
        ),
        "a Keras 3 guide script (keras.distribution on JAX)": ({"epochs": "3"}, GUIDE),
    }
    codes = []
    for name, (hyperparameters, script) in jobs.items():
        code = run_job(engine, image, hyperparameters, script)
        print(f"tf_image_check: {name} in {image} exited {code}", flush=True)
        codes.append(code)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
