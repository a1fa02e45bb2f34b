"""The image stack is the ``images`` extra: a text server never imports it, and an image model
served without it stops at startup with one line naming the extra. Each case runs in a fresh
interpreter, since this test process has long imported everything."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from render_service.model.default_model import ensure_default_model
from render_service.multimodal import IMAGE_STACK

REPO = Path(__file__).resolve().parents[2]

# Simulates an install without the extra: each module of the stack fails to import. numpy stays
# importable, since transformers (a core dependency) needs it; the hook records who imports it.
TEXT_SERVER = """
import json, sys, traceback
from pathlib import Path
STACK = {stack!r}
for name in STACK:
    if name != "numpy":
        sys.modules[name] = None
numpy_importers = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            frames = [f.filename for f in traceback.extract_stack()[:-1]]
            numpy_importers.append(next(f for f in reversed(frames) if "importlib" not in f))
        return None

sys.meta_path.insert(0, Watch())
import render_service.http.app as app_module
from render_service import Renderer
after_import = [m for m in STACK if m in sys.modules and sys.modules[m] is not None]
renderer = Renderer.from_pretrained({model!r})
app = app_module.build_app(renderer)
renderer.render_chat({{"messages": [{{"role": "user", "content": "hi"}}]}})
print(json.dumps({{
    "after_import": after_import,
    "loaded": [m for m in STACK if sys.modules.get(m) is not None],
    "numpy_importers": numpy_importers,
    "ours": sorted(m for m in sys.modules if m.startswith("render_service.multimodal.")),
}}))
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(tmp_path_factory.mktemp("model"))


def test_a_text_server_never_imports_the_image_stack(model_dir: Path) -> None:
    out = run_python(TEXT_SERVER.format(stack=IMAGE_STACK, model=str(model_dir)))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["after_import"] == []  # importing the app loads none of it, numpy included
    assert set(report["loaded"]) <= {"numpy"}
    assert report["ours"] == []
    assert report["numpy_importers"]
    assert not [f for f in report["numpy_importers"] if "/render_service/" in f]


def test_an_image_model_without_the_extra_stops_at_startup(model_dir: Path, tmp_path: Path) -> None:
    image_model = tmp_path / "tiny-vl"
    shutil.copytree(model_dir, image_model)
    (image_model / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor"})
    )
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "from render_service.http.cli import main\n"
        f"main(['serve', {str(image_model)!r}, '--port', '0', '--workers', '1'])\n"
    )
    out = run_python(code)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("render-service: ")
    assert "pip install 'render-service[images]'" in lines[-1]
    assert not [line for line in lines if "Traceback" in line]
