"""Schemathesis fuzzes every operation of /openapi.json against a real server: never a 5xx.

Examples are bounded (hypothesis ``max_examples`` per operation, 30 unless
SCHEMATHESIS_MAX_EXAMPLES says otherwise) so this stays a CI test. The
server runs the embedded model with a tool parser, so derender bodies reach the parsers too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from render_service.http.openapi import openapi_document
from tests.integration.server import RunningServer, running_server

FLAGS = [
    "--served-model-name",
    "default",
    "--max-model-len",
    "512",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--state-secret",
    "schemathesis-secret-0123456789abcdef",
    "--max-body-bytes",
    "1048576",
]


@pytest.fixture(scope="module")
def fuzzed_server(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_server([str(default_model_dir), *FLAGS], tmp_path_factory.mktemp("st")) as server:
        yield server


# The document the server serves is built from the same Structs in-process; the test checks
# below that the served one is identical, so cases can be generated at collection time.
schema = schemathesis.openapi.from_dict(openapi_document())


def test_served_document_is_the_generated_one(fuzzed_server: RunningServer) -> None:
    with fuzzed_server.client() as client:
        assert client.get("/openapi.json").json() == openapi_document()


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_server_errors(case: schemathesis.Case, fuzzed_server: RunningServer) -> None:
    response = case.call(base_url=fuzzed_server.url, timeout=60)
    case.validate_response(response, checks=[not_a_server_error])
    assert fuzzed_server.alive()
