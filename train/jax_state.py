"""Keras 3 on JAX inside `fit`: its model's variables are empty until asked to hold values.

The trainer's callbacks and the scripts' checkpoint helper (train.resumable) both need it
before a save inside an epoch. It is not in train.framework because importing that module
chooses the trainer's Keras, which a user's script must not have imposed on it.
"""

from __future__ import annotations


def attach_state(model) -> None:
    """Make a model's variables hold its current values inside `fit`, before a save there:
    Keras 3 on JAX keeps them apart while it trains (its variables are emptied) and puts them
    back only at an epoch's end, unless a callback asks (jax_state_sync). Every process must
    call it at the same step: it assigns variables that span processes. Other Keras: nothing
    to do."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()
