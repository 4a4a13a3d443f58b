"""The release build (issue 43): `python -m build` from a developer checkout gives an sdist and a wheel with the
production lab bundle, the LICENSE and the deploy files; `twine check` passes; the sdist installed in a fresh
virtualenv gives an enabled server extension and lab extension.

The build runs once for the module, in a copy of the checkout (tracked and untracked files as git sees them, plus
the ignored node_modules and yarn cache so jlpm needs no network, plus the development bundle that `jlpm build`
left in jupyter_gpucr/labextension): building in the checkout itself would replace a colleague's bundle while they
use it. A development bundle's leftovers are planted too, so the check holds from a clean clone as well.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = "share/jupyter/labextensions/jupyter-gpucr"
DEPLOY = "share/jupyter-gpucr/deploy"

# the first test pays for the build (about 2 min) and the last for the install (about 1 min)
pytestmark = pytest.mark.timeout(900)


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        reason = f"{tool} is needed to build the lab extension (scripts/setup.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    print(f"{' '.join(map(str, cmd[:4]))} ...: rc {proc.returncode} in {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc


def _copy_checkout(dst: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / os.fsdecode(name)
        if src.is_file():  # a tracked file a colleague has just deleted is not there
            (dst / src.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / src.relative_to(REPO), follow_symlinks=False)
    for ignored in ("labextension/node_modules", "labextension/.yarn", "jupyter_gpucr/labextension"):
        if (REPO / ignored).is_dir():
            subprocess.run(["cp", "-a", str(REPO / ignored), str(dst / ignored)], check=True)
    # what `jlpm build` (development) leaves, which a release build must not ship
    bundle = dst / "jupyter_gpucr/labextension"
    (bundle / "static").mkdir(parents=True, exist_ok=True)
    (bundle / "build_log.json").write_text(f'{{"context": "{dst}/labextension"}}\n')
    (bundle / "static/dev-leftover.js.map").write_text("{}\n")
    if not (bundle / "static/style.js").exists():
        (bundle / "static/style.js").write_text("/* development bundle */\n")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """sdist from the copied checkout, wheel from that sdist: what `python -m build` does."""
    _need("node")
    base = tmp_path_factory.mktemp("release")
    src, dist = base / "jupyter-gpucr-src", base / "dist"
    src.mkdir()
    _copy_checkout(src)
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], timeout=600)
    (sdist,) = dist.glob("jupyter_gpucr-*.tar.gz")
    (wheel,) = dist.glob("jupyter_gpucr-*.whl")
    return {"src": src, "sdist": sdist, "wheel": wheel, "base": base}


def _check_bundle(names: dict[str, bytes], prefix: str, src: Path) -> None:
    """names: path -> content of every file under the lab bundle at prefix (wheel or sdist)."""
    here = {n[len(prefix) :]: data for n, data in names.items() if n.startswith(prefix)}
    assert "package.json" in here and "static/style.js" in here, sorted(here)
    assert [n for n in here if re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", n)], sorted(here)
    assert "static/third-party-licenses.json" in here, sorted(here)
    assert not [n for n in here if n.endswith(".map") or n.endswith("build_log.json")], sorted(here)
    for name, data in here.items():
        text = data.decode("utf-8", "replace")
        assert str(src) not in text, f"{name} holds the build machine's path {src}"
        if name.endswith(".js") and len(data) > 2000:
            # webpack's development output frames every module with /***/ lines; production output is minified
            assert "/***/" not in text and text.count("\n") < len(data) / 300, f"{name} is not minified"


def test_wheel_contents(built: dict[str, Path]) -> None:
    src = built["src"]
    with zipfile.ZipFile(built["wheel"]) as zf:
        names = {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
    (data,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".data")}
    (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    assert names[f"{info}/licenses/LICENSE"] == (src / "LICENSE").read_bytes()
    assert "BSD 3-Clause" in (src / "LICENSE").read_text() and "jupyter-gpucr contributors" in (src / "LICENSE").read_text()
    metadata = names[f"{info}/METADATA"].decode()
    assert re.search(r"^License(-Expression)?: BSD-3-Clause$", metadata, re.M), metadata[:2000]

    _check_bundle(names, f"{data}/data/{LAB}/", src)
    assert f"{data}/data/{LAB}/install.json" in names
    assert f"{data}/data/etc/jupyter/jupyter_server_config.d/jupyter_gpucr.json" in names

    deploy = sorted(p.relative_to(src / "deploy").as_posix() for p in (src / "deploy").rglob("*") if p.is_file())
    assert "systemd/gpucr-daemon.service" in deploy and [d for d in deploy if d.startswith("kubernetes/")], deploy
    for rel in deploy:
        assert names.get(f"{data}/data/{DEPLOY}/{rel}") == (src / "deploy" / rel).read_bytes(), rel

    hooks = sorted(p.name for p in (src / "kernel_hooks/gpucr_hooks").glob("*.py"))
    assert "__init__.py" in hooks
    assert [h for h in hooks if f"gpucr_hooks/{h}" not in names] == []
    assert "jupyter_gpucr/cli/install-criu.sh" in names
    if (src / "jupyter_gpucr/py.typed").exists():
        assert "jupyter_gpucr/py.typed" in names
    # the development bundle and node's files stay out of the package itself
    assert not [n for n in names if "/labextension/" in n and not n.startswith(f"{data}/")], "bundle twice"
    assert not [n for n in names if "node_modules" in n]


def test_sdist_contents(built: dict[str, Path]) -> None:
    src = built["src"]
    with tarfile.open(built["sdist"]) as tf:
        root = tf.getnames()[0].split("/")[0]
        names = {m.name[len(root) + 1 :]: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert names["LICENSE"] == (src / "LICENSE").read_bytes()
    assert "PKG-INFO" in names and "pyproject.toml" in names
    # the production bundle is in the sdist, so installing it needs neither node nor the npm registry
    _check_bundle(names, "jupyter_gpucr/labextension/", src)
    assert "deploy/systemd/gpucr-daemon.service" in names
    assert not [n for n in names if n.startswith(("labextension/node_modules", "labextension/.yarn/", "labextension/lib/"))]
    assert not [n for n in names if n.endswith(".log") or n.endswith(".tsbuildinfo")]


def test_twine_check(built: dict[str, Path]) -> None:
    proc = _run([sys.executable, "-m", "twine", "check", "--strict", str(built["sdist"]), str(built["wheel"])], timeout=120)
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def _plain(text: str) -> str:
    """Without the colours jupyter's listings put around enabled and OK."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_sdist_installs_a_working_server_and_lab_extension(built: dict[str, Path]) -> None:
    """A fresh virtualenv, pip install of the sdist with the machine's pip configuration (index, cache); then
    what an operator checks first. Jupyter's per-user directories point into the test's temp dir, so nothing
    installed elsewhere on the machine can answer for the package."""
    base = built["base"]
    venv = base / "venv"
    # the checkout's pip (pip --python) installs into the fresh venv: half the time of the venv's bundled pip
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        JUPYTER_CONFIG_DIR=str(base / "jupyter-config"),
        JUPYTER_DATA_DIR=str(base / "jupyter-data"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python")]
    _run([*pip, "install", "-q", str(built["sdist"])], timeout=600, env=env, cwd=base)

    server = _run([str(venv / "bin/jupyter"), "server", "extension", "list"], timeout=120, env=env, cwd=base)
    out = _plain(server.stdout + server.stderr)
    section = out.split(f"{venv}/etc/jupyter", 1)
    assert len(section) == 2 and re.search(r"jupyter_gpucr\s+enabled", section[1]), out
    assert re.search(r"jupyter_gpucr \S+ OK", out), out

    lab = _run([str(venv / "bin/jupyter"), "labextension", "list"], timeout=120, env=env, cwd=base)
    out = _plain(lab.stdout + lab.stderr)
    section = out.split(f"{venv}/share/jupyter/labextensions", 1)
    assert len(section) == 2 and re.search(r"jupyter-gpucr v\S+ enabled\s+OK", section[1]), out
