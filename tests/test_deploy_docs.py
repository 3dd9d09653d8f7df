"""The README's image instructions and deploy/ agree with each other and with the launcher."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from launcher.args import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def deployment_container() -> dict:
    deployment = yaml.safe_load((ROOT / "deploy" / "base" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def shell_commands(text: str) -> list[list[str]]:
    """Each command of the README's bash blocks, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def docker_runs() -> list[tuple[str, list[str]]]:
    """(image, launcher flags) of every `docker run` the README shows."""
    runs = []
    for words in shell_commands(README):
        if words[:2] == ["docker", "run"]:
            image = next(w for w in words if w.startswith("switchyard:"))
            runs.append((image, words[words.index(image) + 1 :]))
    return runs


def test_deployment_requests_one_gpu_per_shard():
    container = deployment_container()
    args = build_parser().parse_args(container["args"])
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == args.num_shard
    assert resources["limits"]["nvidia.com/gpu"] == args.num_shard


def test_readme_builds_the_image_deploy_runs():
    built = {
        words[words.index("-t") + 1]
        for words in shell_commands(README)
        if words[:2] == ["docker", "build"]
    }
    assert deployment_container()["image"] in built
    assert {image for image, _ in docker_runs()} <= built


@pytest.mark.parametrize(("image", "flags"), docker_runs())
def test_readme_docker_runs_pass_flags_the_launcher_accepts(image, flags):
    args = build_parser().parse_args(flags)  # argparse exits (status 2) on a flag it does not know
    # ... and each flag the README passes lands where the launcher reads it.
    given = [f.split("=")[0].lstrip("-").replace("-", "_") for f in flags if f.startswith("--")]
    assert all(getattr(args, name) not in (None, False) for name in given), given


def test_readme_says_where_the_launcher_is_installed():
    assert ".venv/bin/launcher" in README
