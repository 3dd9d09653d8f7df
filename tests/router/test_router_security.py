"""--api-key (Bearer auth, constant-time compare) and --cors-allow-origin."""

import hmac

from launcher.commands import API_KEY_ENV as LAUNCHER_API_KEY_ENV
from router import auth
from router.args import API_KEY_ENV, parse_args
from tests.router.harness import async_test, parse_sse, router_env

KEY = "s3cret-key"
BODIES = {
    "/generate": {"inputs": "H", "parameters": {"max_new_tokens": 2}},
    "/generate_stream": {"inputs": "H", "parameters": {"max_new_tokens": 2}},
    "/": {"inputs": "H", "parameters": {"max_new_tokens": 2}},
    "/tokenize": {"inputs": "H"},
    "/v1/completions": {"prompt": "H", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "H"}], "max_tokens": 2},
}


@async_test
async def test_api_key_guards_the_generation_routes(model_dir, monkeypatch):
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    async with router_env(model_dir, api_key=KEY) as env:
        for path, body in BODIES.items():
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
                r = await env.client.post(path, json=body, headers=headers)
                assert r.status == 401, (path, headers)
                assert r.headers["WWW-Authenticate"] == "Bearer"
                assert (await r.json())["error_type"] == "unauthorized"
            for scheme in ("Bearer", "bearer"):
                r = await env.client.post(
                    path, json=body, headers={"Authorization": f"{scheme} {KEY}"}
                )
                assert r.status == 200, (path, await r.text())
        assert (KEY.encode(), KEY.encode()) in compared and (b"nope", KEY.encode()) in compared
        # Probes and scrapers need no key (as in TGI).
        for path in ("/health", "/info", "/metrics", "/v1/models"):
            assert (await env.client.get(path)).status == 200, path
        # Refused requests never reached the scheduler.
        assert len(env.shards[0].prefilled) == 2 * (len(BODIES) - 1)


def test_api_key_from_the_environment(monkeypatch, tmp_path):
    assert API_KEY_ENV == LAUNCHER_API_KEY_ENV  # the launcher hands the key over there
    argv = ["--model-id", "m", "--shard-uds-path", "p"]
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert parse_args(argv).api_key is None
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert parse_args(argv).api_key == KEY
    assert parse_args([*argv, "--api-key", "flag"]).api_key == "flag"
    origins = parse_args([*argv, "--cors-allow-origin", "https://a,https://b"]).cors_allow_origin
    assert origins == ("https://a", "https://b")


@async_test
async def test_cors_preflight_and_headers(model_dir):
    ok, evil = "https://app.example", "https://evil.example"
    async with router_env(model_dir, api_key=KEY, cors_allow_origin=(ok,)) as env:
        preflight = {"Origin": ok, "Access-Control-Request-Method": "POST"}
        # A preflight carries no credentials: it must not need the key.
        r = await env.client.options("/v1/chat/completions", headers=preflight)
        assert r.status == 204
        assert r.headers["Access-Control-Allow-Origin"] == ok
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
        assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        r = await env.client.options("/generate", headers={**preflight, "Origin": evil})
        assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers

        auth_header = {"Authorization": f"Bearer {KEY}"}
        r = await env.client.post(
            "/generate", json=BODIES["/generate"], headers={**auth_header, "Origin": ok}
        )
        assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == ok
        assert "x-generated-tokens" in r.headers["Access-Control-Expose-Headers"]
        # Streamed responses send their headers before the handler returns.
        r = await env.client.post(
            "/generate_stream", json=BODIES["/generate"], headers={**auth_header, "Origin": ok}
        )
        assert r.headers["Access-Control-Allow-Origin"] == ok
        assert len(parse_sse(await r.text())) == 2
        # Errors too, so a browser can read why it was refused.
        r = await env.client.post("/generate", json=BODIES["/generate"], headers={"Origin": ok})
        assert r.status == 401 and r.headers["Access-Control-Allow-Origin"] == ok
        r = await env.client.get("/info", headers={"Origin": evil})
        assert "Access-Control-Allow-Origin" not in r.headers

    async with router_env(model_dir, cors_allow_origin=("*",)) as env:
        r = await env.client.get("/info", headers={"Origin": evil})
        assert r.headers["Access-Control-Allow-Origin"] == "*"

    async with router_env(model_dir) as env:  # no flag: no CORS at all
        r = await env.client.options("/generate", headers=preflight)
        assert r.status == 405 and "Access-Control-Allow-Origin" not in r.headers
        r = await env.client.get("/info", headers={"Origin": ok})
        assert "Access-Control-Allow-Origin" not in r.headers
