"""Fixtures of the SageMaker tooling tests: no test here can reach AWS.

Clients are only made with fake credentials, an endpoint on a closed local port and botocore's
Stubber in front, so an unexpected call fails the test instead of leaving the machine.
"""

from __future__ import annotations

import pytest
from botocore.stub import Stubber
from sagemaker_testing import offline_client


@pytest.fixture
def stubbed():
    """(sagemaker client, logs client, their Stubbers), active; every stubbed reply must be used."""
    sagemaker, logs = offline_client("sagemaker"), offline_client("logs")
    with Stubber(sagemaker) as sm_stub, Stubber(logs) as logs_stub:
        yield sagemaker, logs, sm_stub, logs_stub
        sm_stub.assert_no_pending_responses()
        logs_stub.assert_no_pending_responses()


@pytest.fixture
def no_clients():
    """A client factory that fails the test if anything tries to reach AWS."""

    def refuse():
        pytest.fail("an AWS client was created, so a request could have been sent")

    return refuse
