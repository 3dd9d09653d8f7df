import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from it_cases import TINY_MODELS  # noqa: E402

from launcher.tiny_models import build_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {name: build_model(root / name, **kw) for name, kw in TINY_MODELS.items()}
