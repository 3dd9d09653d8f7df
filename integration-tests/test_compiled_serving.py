"""--compile through the real launcher and HTTP: a tiny Qwen2 (q/k/v biases, tied embeddings, a
sliding-window layer) served compiled gives transformers' greedy ids and logprobs, prompt
logprobs included, with prompts chunked into steps that mix them with decoding rows and sixteen
requests at once."""

import pytest
from server_process import LauncherProcess
from test_generate_vs_transformers import PREFILL_BUDGET
from test_generate_vs_transformers import (
    test_greedy_ids_and_logprobs_equal_transformers as _greedy_ids_and_logprobs,
)
from test_generate_vs_transformers import (
    test_sixteen_concurrent_requests_equal_sequential_reference as _sixteen_concurrent,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tiny_model_dirs):
    model_dir = tiny_model_dirs["qwen2"]
    with LauncherProcess(
        model_dir,
        "--dtype", "float32",
        "--max-batch-total-tokens", "4096",
        "--max-batch-prefill-tokens", PREFILL_BUDGET,
        "--compile",
    ) as server:  # fmt: skip
        assert "--compile: the forward pass is compiled" in server.log_text()
        yield server, model_dir


def test_compiled_greedy_ids_and_logprobs_equal_transformers(served):
    _greedy_ids_and_logprobs(served)


def test_compiled_sixteen_concurrent_requests_equal_sequential_reference(served):
    _sixteen_concurrent(served)
