"""Every object in deploy/ is valid against the API schemas of the Kubernetes versions we
support, strictly (an unknown or misspelt field is an error, as `kubectl apply` would make it
with server-side field validation), as written and as kustomize builds it."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.deploy.manifests import KUSTOMIZATIONS, Obj, build, object_files, objects, written

# The oldest Kubernetes release still maintained upstream when this was written, and the newest
# that the pinned kubernetes-validate carries schemas for.
KUBERNETES_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
# kubernetes-validate knows the built-in APIs only. The Prometheus Operator's objects are checked
# against its CRD schema as cloudcoil's generated models carry it (pydantic; see crd_problems).
OPERATOR_GROUP = "monitoring.coreos.com/"


def validate(obj: Obj) -> None:
    if obj["apiVersion"].startswith(OPERATOR_GROUP):
        assert crd_problems(obj) == []
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def crd_problems(obj: Obj) -> list[str]:
    """The fields the CRD's schema rejects (pydantic raises) or does not know: its models
    ignore unknown fields, so a field lost in the round trip was not in the schema."""
    # imported here: its thousands of models take ~3 s, which every test worker would pay
    # collecting this file
    from cloudcoil.models.prometheus_operator import v1 as prometheus_operator

    model = getattr(prometheus_operator, obj["kind"])
    kept = model.model_validate(obj).model_dump(by_alias=True, exclude_unset=True, mode="json")
    return list(_lost(obj, kept))


def _lost(given, kept, path=""):
    if isinstance(given, dict):
        for key, value in given.items():
            if key not in kept:
                yield f"{path}.{key}"
            else:
                yield from _lost(value, kept[key], f"{path}.{key}")
    elif isinstance(given, list):
        for i, (a, b) in enumerate(zip(given, kept, strict=True)):
            yield from _lost(a, b, f"{path}[{i}]")


@pytest.mark.parametrize("path", object_files(), ids=lambda p: str(p.relative_to(p.parents[2])))
def test_written_objects_are_valid(path):
    docs = objects(path)
    assert docs, f"{path} holds no object"
    for obj in docs:
        validate(obj)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_built_objects_are_valid(kustomization):
    for obj in build(kustomization):
        validate(obj)


def test_the_crd_check_sees_unknown_and_wrong_fields():
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m"},
        "spec": {"selector": {}, "endpoints": [{"port": "http", "pathh": "/metrics"}]},
    }
    assert crd_problems(monitor) == [".spec.endpoints[0].pathh"]
    monitor["spec"]["endpoints"][0] = {"port": "http", "scheme": "ftp"}
    with pytest.raises(ValueError, match="scheme"):
        crd_problems(monitor)


def test_the_schema_check_sees_a_misspelt_field():
    deployment = written("Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError, match="terminationGracePeriod"):
        validate(deployment)
