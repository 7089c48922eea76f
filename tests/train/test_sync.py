"""train.sync's contract (`Sync`): every stack implements all of it, and what each stack's
step is. Mirrored and KerasOnJax train only in the images' tests (tests/image), so a method one
of them lacks must fail here first. The checks run in a process of their own: importing
train.sync starts MPI, which the test process must not hold while others run mpirun."""

import json
import subprocess
import sys

from tests.conftest import ROOT

CHECKS = '''
import json
import tensorflow as tf
from train.accumulation import AccumulatingModel
from train.sync import Horovod, KerasOnJax, Mirrored, Sync

report = {}
for stack in (Horovod, Mirrored, KerasOnJax):
    report[stack.__name__] = {
        "is_sync": issubclass(stack, Sync),
        "missing": sorted(getattr(stack, "__abstractmethods__", ["(no contract)"])),
        "documented": sorted(name for name in getattr(Sync, "__abstractmethods__", ())
                             if not (getattr(Sync, name).__doc__ or "").strip()),
    }

def optimizer(**options):
    """The trainer's optimizer factory: what each stack asks for arrives as keywords."""
    return tf.keras.optimizers.SGD(0.1, **options)

model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
# Not constructed (that starts MWMS or JAX's distribution); step and batches_per_step read no
# state of the instance.
jax, mirrored = object.__new__(KerasOnJax), object.__new__(Mirrored)
for steps in (1, 4):
    stepper, made = jax.step(model, lambda **options: options, steps)
    report[f"jax {steps}"] = [stepper is model, made, jax.batches_per_step(steps)]
    stepper, made = mirrored.step(model, optimizer, steps)
    report[f"mirrored {steps}"] = [
        stepper is model, isinstance(stepper, AccumulatingModel),
        getattr(stepper, "steps", None), type(made).__name__, mirrored.batches_per_step(steps)]
print(json.dumps(report))
'''


def test_every_stack_implements_the_whole_documented_contract_and_its_own_step():
    result = subprocess.run(
        [sys.executable, "-c", CHECKS], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    for stack in ("Horovod", "Mirrored", "KerasOnJax"):
        assert report[stack] == {"is_sync": True, "missing": [], "documented": []}, report
    # Keras 3 on JAX: Keras' own step, its optimizer accumulating k batches of `fit`
    assert report["jax 1"] == [True, {}, 1]
    assert report["jax 4"] == [True, {"gradient_accumulation_steps": 4}, 4]
    # MWMS: Keras' own step, or one step of k micro-batches in one batch of `fit`
    assert report["mirrored 1"] == [True, False, None, "SGD", 1]
    assert report["mirrored 4"] == [False, True, 4, "SGD", 1]
