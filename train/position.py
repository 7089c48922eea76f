"""Where a job stands, so that a stopped job continues at the very step it stopped.

A checkpoint records three numbers besides the weights and the optimizer: whole epochs done,
the samples trained in the epoch it stopped in, and the samples trained over the whole job (all
ranks, every attempt). Each rank's place in its data follows from the last one alone: rank r has
trained on samples_done / world_size samples of its stream (every rank takes the same
per-device batch each step), and its stream is a pure function of (seed, pass)
(train.pipeline), so the restarted rank rebuilds it at that sample.

A restart with another number of hosts keeps the step: the epoch and the steps done in it
(converted through the global batch when that changed). The shares are dealt anew, so each rank
continues the same fraction of the way through its new share; which samples the interrupted
epoch had already seen is not carried over, so until the epoch ends some samples may come
twice and others not at all. With the same hosts and batch nothing changes but the process.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobPosition:
    epochs_done: int
    steps_in_epoch: int  # optimizer steps done of epoch epochs_done + 1
    samples_done: int  # samples trained over all ranks and attempts

    @classmethod
    def from_state(cls, state: dict, global_batch: int, steps_per_epoch: int) -> JobPosition:
        """The position a checkpoint's state records, in this job's global batch; a state
        written before positions were recorded resumes at its epoch's start."""
        epochs = state.get("epochs_done", 0)
        steps = round(state.get("epoch_samples", 0) / global_batch)
        samples = state.get("samples_done", epochs * steps_per_epoch * global_batch)
        return cls(epochs, min(steps, steps_per_epoch - 1), samples)

    def after(self, steps: int, global_batch: int, steps_per_epoch: int) -> JobPosition:
        """The position `steps` optimizer steps later."""
        epochs, in_epoch = divmod(self.steps_in_epoch + steps, steps_per_epoch)
        return JobPosition(
            self.epochs_done + epochs, in_epoch, self.samples_done + steps * global_batch
        )

    def counts(self, global_batch: int) -> dict:
        """What a checkpoint's state records besides epochs_done (which names its folder)."""
        return {
            "epoch_samples": self.steps_in_epoch * global_batch,
            "samples_done": self.samples_done,
        }

    def describe(self) -> str:
        if not self.steps_in_epoch:
            return f"epoch {self.epochs_done + 1}"
        return f"epoch {self.epochs_done + 1}, step {self.steps_in_epoch + 1}"


def stream_start(samples_done: int, world_size: int, share: int) -> tuple[int, int]:
    """(pass, samples into that pass) of one rank's stream, its share holding `share` samples."""
    return divmod(samples_done // world_size, share)
