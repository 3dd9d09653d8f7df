"""Schemathesis against the real launcher (issue 47, 4a): tests/router/test_router_fuzz.py fuzzes
the router over fake shards; this run puts a real shard, a tiny random Llama, behind it, so
whatever reaches the shards is computed. Every route of GET /openapi.json gets schemathesis'
coverage cases (boundary and type-breaking values, field by field) and hypothesis-fuzzed bodies,
positive and negative. No answer is a 5xx (nor a 424: a shard failing on what the router let
through), every answer is one the document gives (status, Content-Type, body), what the
document calls invalid is refused, and afterwards the server is healthy: /health 200, a plain
/generate works, and once idle every KV block, permit and adapter slot has come back.

Time bound: --max-total-tokens 32 makes every generation short (and larger asks 422s), the
coverage cases are a stride sample of each operation's list, hypothesis runs a few examples per
operation and mode without shrinking, and 8 clients send them at once (so the shard also
batches fuzzed parameters together).
"""

from __future__ import annotations

import functools
import itertools
import random
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup
from server_process import LauncherProcess

from bench.soak_checks import wait_idle
from tests.shard.lora_fixtures import ADAPTERS, make_adapter

pytestmark = pytest.mark.slow
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]  # fmt: skip
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
COVERAGE_CASES = 16  # per operation and mode, spread over its whole coverage list
FUZZ_EXAMPLES = 8  # hypothesis examples per operation and mode
CLIENTS = 8  # requests in flight: the shard batches fuzzed requests together
TIMEOUT_S = 60  # one answer; longer is a hang (every generation is at most 32 tokens)
LIMITS = ("--dtype", "float32", "--max-input-tokens", "24", "--max-total-tokens", "32",
          "--served-model-name", "tiny")  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_model_dirs, tmp_path_factory):
    base = tiny_model_dirs["llama"]
    lora_dir = tmp_path_factory.mktemp("fuzz-lora")
    adapter = make_adapter(base, lora_dir / "sql", seed=0, **ADAPTERS["qv_r4"])
    flags = ("--lora-adapters", f"sql={adapter}", "--enable-lora-runtime-loading",
             "--lora-dir", str(lora_dir))  # fmt: skip
    with LauncherProcess(base, *LIMITS, *flags) as launched:
        yield launched


def spread(cases: Iterable, count: int) -> list:
    """`count` cases evenly spaced over the list: the coverage phase goes field by field, so
    its first cases would all be about the first fields."""
    cases = list(cases)
    step = max(1, len(cases) // count)
    return cases[::step][:count]


def coverage_cases(schema, operation, mode: GenerationMode) -> list:
    config = schema.config.generation_for(operation=operation, phase="coverage")
    every = schema.iter_coverage_cases(operation, generation_modes=[mode], generation_config=config)
    return spread(every, COVERAGE_CASES)


def fuzzed_cases(operation, mode: GenerationMode) -> list:
    """Hypothesis' examples, drawn (no shrinking: a failure is recorded, not minimised)."""
    drawn: list = []

    @hypothesis.settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def draw(case):
        drawn.append(case)

    draw()
    return drawn


def all_cases(schema, operations) -> list:
    """Every operation's cases, shuffled (seeded) so that the requests in flight together mix
    routes, and the shard's batches mix whatever the fuzzer put in their parameters."""
    cases: list = []
    for operation, mode in itertools.product(operations, MODES):
        cases += coverage_cases(schema, operation, mode)
        # Hypothesis cannot break a body or a query an operation does not have.
        if mode == GenerationMode.POSITIVE or operation.body or operation.query:
            cases += fuzzed_cases(operation, mode)
    random.Random(0).shuffle(cases)
    return cases


def call(url: str, case) -> tuple[int | None, str]:
    """The answer's status and what is wrong with it ("" when nothing)."""
    with requests.Session() as session:
        try:
            response = case.call_and_validate(
                base_url=url, session=session, checks=CHECKS, timeout=TIMEOUT_S
            )
        # A check's verdict (a FailureGroup, which is no Exception), a hang, a reset:
        # collected, not raised, so one run shows them all.
        except (Exception, FailureGroup) as err:
            return None, f"{case.method} {case.path} {case.body!r}:\n{err}"
    # A real shard that fails a step (424) on a body the router accepted is a bug of one side
    # or the other: the router must refuse what the shards cannot do.
    if response.status_code == 424:
        return 424, f"424 {case.path} {case.body!r}: {response.text}"
    return response.status_code, ""


def test_real_shard_answers_every_body_as_documented_and_stays_healthy(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 13
    cases = all_cases(schema, operations)
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(functools.partial(call, server.url), cases))
    statuses = Counter(status for status, _ in answers)
    failures = [failure for _, failure in answers if failure]
    shown = "\n\n".join(f[:2000] for f in failures[:5])  # fuzzed bodies can be long
    assert not failures, f"{len(failures)} failures, e.g.:\n{shown}"
    # Both verdicts were reached: generations ran on the shard, and refusals were given.
    assert statuses.get(200, 0) > 50 and statuses.get(422, 0) > 50, statuses

    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    plain = requests.post(
        f"{server.url}/generate",
        json={"inputs": "Hello", "parameters": {"max_new_tokens": 8}},
        timeout=TIMEOUT_S,
    )
    assert plain.status_code == 200, plain.text
    assert isinstance(plain.json()["generated_text"], str)
    idle = wait_idle(server.url)
    assert idle.clean, idle.describe()
