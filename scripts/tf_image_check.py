"""Run a TensorFlow 2.21 image's job on this machine and report the image's size.

    python scripts/tf_image_check.py IMAGE

`make build-tf-gpu` calls it after building the GPU variant, which cannot meet a GPU here:
TensorFlow falls back to the CPU, so the run proves the image's stack and launcher, not CUDA.
The job is `make train`'s default job (the built-in trainer on the embedded digits) on 2
MultiWorkerMirroredStrategy workers in one container. Exit code: the job's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.local_cluster import Engine  # noqa: E402  (the project root is on the path now)


def main(image: str) -> int:
    engine = Engine.detect()
    size = json.loads(engine.run("image", "inspect", image).stdout)[0]["Size"]
    print(f"tf_image_check: {image} is {size / 1e9:.2f} GB", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "ml"
        subprocess.run([sys.executable, str(REPO / "scripts" / "default_job.py"), "--ml-root",
                        str(root), "--no-run"], check=True, capture_output=True)
        (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps({
            "processes_per_host": "2", "epochs": "3", "learning_rate": "0.002"}))
        job = engine.run("run", "--rm", "-v", f"{root}:/opt/ml", image, "train", check=False,
                         timeout=900)
    lines = [line for line in job.stdout.splitlines()
             if "rank(s)" in line or "METRICS" in line or "RESULT" in line
             or "launcher: job" in line]
    print("\n".join(lines), flush=True)
    if job.returncode:
        print(job.stdout[-3000:] + job.stderr[-3000:], file=sys.stderr)
    print(f"tf_image_check: the job in {image} exited {job.returncode}", flush=True)
    return job.returncode


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
