"""Validation errors are JSON 422s naming the field, on /generate and /generate_stream alike."""

import pytest
import requests
from server_process import LauncherProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model_dirs):
    with LauncherProcess(
        tiny_model_dirs["llama"],
        "--dtype",
        "float32",
        "--max-input-tokens",
        "64",
        "--max-total-tokens",
        "128",
        "--max-batch-total-tokens",
        "2048",
    ) as s:
        yield s


@pytest.mark.parametrize("route", ["/generate", "/generate_stream"])
@pytest.mark.parametrize(
    "parameters, field",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 1000}, "max_new_tokens"),
        ({"top_k": -3}, "top_k"),
    ],
)
def test_invalid_parameter_is_a_422_naming_the_field(server, route, parameters, field):
    r = requests.post(f"{server.url}{route}", json={"inputs": "Hello", "parameters": parameters})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error_type"] == "validation"
    assert field in body["error"]


def test_too_long_input_names_the_limit(server):
    r = requests.post(f"{server.url}/generate", json={"inputs": "fox " * 200})
    assert r.status_code == 422
    assert "64" in r.json()["error"]


def test_server_still_answers_after_errors(server):
    requests.post(
        f"{server.url}/generate", data=b"{not json", headers={"content-type": "application/json"}
    )
    r = requests.post(
        f"{server.url}/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}}
    )
    assert r.status_code == 200
    assert r.json()["generated_text"] is not None
    info = requests.get(f"{server.url}/info").json()
    assert info["max_input_tokens"] == 64 and info["max_total_tokens"] == 128
