"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing page in the nav or
an API reference to a name that does not exist fails the build."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_docs_build_strict(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "secure_redispatch" in api and "RedispatchLayer" in api   # the reference is generated, not empty
