"""The series that the Grafana dashboard, the autoscaler and prometheus-adapter's rule read are
series the router exports, by their exact names in GET /metrics (`_total`, `_bucket`, ...),
scraped from a real router on fake shards after requests that fill every kind of series."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import yaml

from launcher.tiny_models import build_tokenizer
from tests.deploy.manifests import DEPLOY, written
from tests.router.harness import router_env, scrape

DASHBOARD = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
ADAPTER = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-adapter-values.yaml").read_text())
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "Inf", "NaN"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings, label matchers,
    ranges, grouping clauses, functions and keywords are taken out."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\b\s*(\([^)]*\))?", " ", expr)
    found = re.findall(r"(?<![\w.$])([a-zA-Z_:][\w:]*)\b(?!\s*\()", expr)
    return set(found) - PROMQL_WORDS


def dashboard_names() -> set[str]:
    exprs = [t["expr"] for p in DASHBOARD["panels"] for t in p["targets"]]
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":  # label_values(metric, label)
            exprs.append(re.fullmatch(r"label_values\((.+),\s*\w+\)", var["definition"])[1])
    return set().union(*map(metric_names, exprs))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> set[str]:
    model_dir = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(512).save_pretrained(model_dir)

    async def run() -> set[str]:
        async with router_env(model_dir) as env:
            for body in ({"max_new_tokens": 3}, {"max_new_tokens": 0}):  # served, refused (422)
                await env.client.post("/generate", json={"inputs": "H", "parameters": body})
            return {key.split("{")[0] for key in await scrape(env.client)}

    return asyncio.run(asyncio.wait_for(run(), 60))


def test_the_expression_parser():
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{ns="$x",e=~"a|b"}[$__rate_interval])))'
        " / on(pod) group_left b_total offset 5m + sum without (pod) (c) > bool 2"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_the_dashboard_reads_exported_series(exported):
    names = dashboard_names()
    assert {"tgi_queue_size", "tgi_request_duration_bucket"} <= names  # the parser found them
    assert names - exported == set()


def test_the_autoscaler_metric_is_exported_and_adapted(exported):
    (metric,) = written("HorizontalPodAutoscaler", "deploy/monitoring")["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    (rule,) = ADAPTER["rules"]["custom"]
    assert rule["name"]["as"] == name  # the adapter serves the metric under the HPA's name
    assert re.fullmatch(rule["name"]["matches"], name)
    assert metric_names(rule["seriesQuery"]) == {name} and name in exported
    # A per-pod metric: the adapter maps the scraped series' pod and namespace labels.
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
