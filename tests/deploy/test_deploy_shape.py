"""deploy/'s objects fit each other and the server: names and labels that must match do, the
pod's timings cover what the launcher does, and the CPU overlay really leaves the GPUs out."""

from __future__ import annotations

from launcher.args import build_parser
from launcher.supervisor import SupervisorSettings
from tests.deploy.manifests import build, container, written

POD_LABELS = {"app.kubernetes.io/name": "switchyard"}


def pod_spec() -> dict:
    return written("Deployment")["spec"]["template"]["spec"]


def test_selectors_pick_the_deployments_pods():
    deployment = written("Deployment")
    assert deployment["spec"]["template"]["metadata"]["labels"] == POD_LABELS
    assert deployment["spec"]["selector"]["matchLabels"] == POD_LABELS
    assert written("Service")["spec"]["selector"] == POD_LABELS
    assert written("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == POD_LABELS
    assert written("NetworkPolicy")["spec"]["podSelector"]["matchLabels"] == POD_LABELS


def test_monitoring_finds_the_service_and_scales_the_deployment():
    service = written("Service")
    monitor = written("ServiceMonitor", "deploy/monitoring")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}
    target = written("HorizontalPodAutoscaler", "deploy/monitoring")["spec"]["scaleTargetRef"]
    deployment = written("Deployment")
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    # The autoscaler owns the count: a replicas field would reset it at every apply.
    assert "replicas" not in deployment["spec"]


def test_the_pod_outlives_the_launchers_orderly_stop():
    """SIGTERM: the launcher gives the router, then the shards, their grace each; the pod's
    grace must cover that and the preStop pause before it, with room to spare."""
    sleep, pause_s = container(written("Deployment"))["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == "sleep"
    stop_s = int(pause_s) + 2 * SupervisorSettings().grace_period_s
    assert pod_spec()["terminationGracePeriodSeconds"] >= 2 * stop_s


def test_the_startup_probe_waits_for_a_big_model():
    c = container(written("Deployment"))
    probe = c["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 20 * 60
    probes = (probe, c["readinessProbe"], c["livenessProbe"])
    assert {p["httpGet"]["path"] for p in probes} == {"/health"}
    # The launcher must not give up on loading shards before the probe gives up on the pod.
    args = build_parser().parse_args(c["args"])
    assert args.shard_startup_timeout <= probe["periodSeconds"] * probe["failureThreshold"]


def test_volumes_the_server_writes_to():
    spec, c = pod_spec(), container(written("Deployment"))
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    # The Dockerfile points HF_HOME, SWITCHYARD_CACHE and the kernel caches under /data.
    claim = written("PersistentVolumeClaim")["metadata"]["name"]
    assert mounts["/data"]["persistentVolumeClaim"]["claimName"] == claim
    assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory"
    assert "emptyDir" in mounts["/tmp"]  # the root filesystem is read-only
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_runs_as_the_images_user_without_privileges():
    pod, c = pod_spec()["securityContext"], container(written("Deployment"))["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 1000  # the Dockerfile's USER
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["allowPrivilegeEscalation"] is False and c["capabilities"] == {"drop": ["ALL"]}


def test_the_cpu_overlay_leaves_the_gpus_out():
    built = {o["kind"]: o for o in build("deploy/cpu")}
    c = container(built["Deployment"])
    assert c["image"] == "switchyard:cpu"
    assert "nvidia.com/gpu" not in str(built["Deployment"])
    args = build_parser().parse_args(c["args"])
    assert args.num_shard == 1 and args.model_id is None  # the default (demo) model
    assert built["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    # Everything else is the base's: the overlay changes only what a CPU needs.
    assert c["securityContext"] == container(written("Deployment"))["securityContext"]


def test_the_gpu_build_is_the_base_as_written():
    built = {o["kind"]: o for o in build("deploy")}
    assert built["Deployment"] == written("Deployment")
