"""JAX's heartbeat made longer than the launcher's watchdog, so that a frozen process is named.

JAX's coordination service ends every process of a job once one of them has sent no heartbeat
for `jax.distributed.initialize`'s `heartbeat_timeout_seconds` (100 s by default). A frozen
process (SIGSTOP, a dead device driver) then ends the job as "rank 0 killed by signal 6": the
survivor aborts, and the failure names it rather than the frozen one. The launcher's watchdog
(container.watchdog) names the frozen process, with every rank's stack, but it waits
`progress_timeout` (at least 120 s) and, before the first progress, `first_progress_timeout`.

So the launcher hands every rank a longer heartbeat in JAX_HEARTBEAT_ENV
(job.launch_config.LaunchConfig.jax_heartbeat), and `lengthen` makes it the default of
`jax.distributed.initialize` in this process: `keras.distribution.initialize()` passes no
heartbeat of its own, and JAX reads no environment variable for it. A script that passes
`heartbeat_timeout_seconds` itself keeps its value. Script mode applies it when the script
imports JAX (train.keras_script.install); the built-in trainer before it joins the job
(train.sync.KerasOnJax).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from job.errors import ConfigError
from job.launch_config import JAX_HEARTBEAT_ENV

PARAMETER = "heartbeat_timeout_seconds"  # jax.distributed.initialize's
_LENGTHENED = "_launcher_heartbeat"  # set on the wrapper: apply once per process


def planned_seconds(environ: Mapping[str, str]) -> int | None:
    """The heartbeat the launcher planned for this rank; None when it planned none (the
    watchdog is off: JAX's own heartbeat is then what ends a frozen process)."""
    text = environ.get(JAX_HEARTBEAT_ENV, "").strip()
    if not text:
        return None
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise ConfigError(
            f"{JAX_HEARTBEAT_ENV}={text!r} is not a whole number of seconds of at least 1; the "
            "launcher sets it from progress_timeout: remove the `-x` that overrides it from "
            "mpi_options, or give a whole number"
        )
    return seconds


def with_heartbeat(
    initialize: Callable[..., Any], seconds: int, said: Callable[[int, int], None]
) -> Callable[..., Any]:
    """`initialize` (jax.distributed.initialize) whose heartbeat is `seconds` unless the call
    passes one, by name or by position; `said(seconds, jax_default)` once it returned.
    A JAX without the parameter gets `initialize` back as it is."""
    signature = inspect.signature(initialize)
    if PARAMETER not in signature.parameters:
        return initialize
    default = signature.parameters[PARAMETER].default

    @functools.wraps(initialize)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            given = PARAMETER in signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            given = True  # a call JAX itself refuses: let it say so
        if given:
            return initialize(*args, **kwargs)
        result = initialize(*args, **{**kwargs, PARAMETER: seconds})
        said(seconds, default)
        return result

    setattr(wrapper, _LENGTHENED, True)
    return wrapper


def lengthen(jax: Any, say: Callable[[str], None], environ: Mapping[str, str] = os.environ) -> None:
    """Make the planned heartbeat the default of this process's `jax.distributed.initialize`
    (once); `say` logs what was set and why once the process joined (a line of the leader's
    log, train.logs)."""
    seconds = planned_seconds(environ)
    distributed = jax.distributed
    if seconds is None or getattr(distributed.initialize, _LENGTHENED, False):
        return

    def said(seconds: int, default: Any) -> None:
        say(
            f"JAX's heartbeat timeout is {seconds} s, not its default {default} s "
            f"({JAX_HEARTBEAT_ENV}, longer than progress_timeout and first_progress_"
            "timeout): a frozen process is ended and named by the launcher's watchdog "
            "before JAX would abort the processes waiting for it; pass "
            f"{PARAMETER} to jax.distributed.initialize to choose your own"
        )

    distributed.initialize = with_heartbeat(distributed.initialize, seconds, said)
