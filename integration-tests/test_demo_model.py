"""`launcher` with no --model-id builds the demo model once, then serves it."""

import pytest
import requests
from server_process import LauncherProcess

pytestmark = pytest.mark.slow


def test_launcher_without_model_id_serves_the_demo_model(tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHYARD_CACHE", str(tmp_path))
    with LauncherProcess(None, "--max-batch-total-tokens", "4096") as server:
        r = requests.post(
            f"{server.url}/generate",
            json={
                "inputs": "The quick brown fox",
                "parameters": {"max_new_tokens": 8, "details": True},
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["details"]["generated_tokens"] == 8
        assert requests.get(f"{server.url}/info").json()["model_dtype"] == "float32"
    assert (tmp_path / "demo-llama-v1" / "config.json").exists()
