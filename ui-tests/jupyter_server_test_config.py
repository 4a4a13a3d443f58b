"""Jupyter server configuration for the jupyter-gpucr UI tests.

!! Never use this configuration in production: it turns off authentication
and exposes the JupyterLab application object to the page.

- token off, XSRF checks off, a temporary root directory (galata's defaults);
- port from GPUCR_UI_PORT (default 8899, so a developer's 8888 is left alone);
- the UI built in this checkout (jupyter_gpucr/labextension) is served ahead
  of any copy installed in the environment, so the tests always see the
  current build;
- the gpucr server extension enabled, with its checkpoints in a temporary
  directory (GPUCR_UI_STORE overrides); jupyter-resource-usage (installed for
  the server's own tests beside it) disabled, server and lab extension;
- JupyterLab's user settings in a temporary directory: tests that turn galata's
  in-memory settings off (mockSettings: false) write real settings there, never
  into ~/.jupyter. JupyterLab's news and update checks are off in it.
- a second Python kernelspec, ``python3-idle``, whose kernels are suspended
  after 5 s without activity (the idle timeout of every other kernel is a
  day, so that no other test's kernel goes to disk on its own);
- a host memory budget of 16 GiB and a third kernelspec, ``python3-room``,
  whose kernels declare 10 GiB (room.spec.ts reads what the side panel says
  they hold); a kernel is idle, for making room, as soon as no cell runs. No
  other kernel declares memory, and theirs is far below the budget: no test
  but a deliberate one has a kernel suspended to make room.
"""
import json
import os
import sys
import tempfile
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # noqa: F821

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

c.ServerApp.port = int(os.environ.get("GPUCR_UI_PORT", "8899"))  # noqa: F821
c.ServerApp.ip = "127.0.0.1"  # noqa: F821
c.ServerApp.allow_root = True  # noqa: F821  (CI and the CRIU engine run as root)

# Serve this checkout's build first (then galata's helper extension).
_labext = REPO / "jupyter_gpucr" / "labextension"
_extra = [str(Path(c.LabServerApp.extra_labextensions_path))]  # noqa: F821
if (_labext / "package.json").exists():
    _linkdir = Path(tempfile.mkdtemp(prefix="gpucr-labext-"))
    (_linkdir / "jupyter-gpucr").symlink_to(_labext)
    _extra.insert(0, str(_linkdir))
c.LabServerApp.extra_labextensions_path = _extra  # noqa: F821

# The gpucr server extension (also enabled by its jupyter-config file when
# installed; explicit here so that a checkout on PYTHONPATH works too).
c.ServerApp.jpserver_extensions = {"jupyter_gpucr": True, "jupyter_resource_usage": False}  # noqa: F821

# JupyterLab as it comes, plus gpucr: jupyter-resource-usage (in the test extra, for the server's
# own tests beside it) would add its Kernel Usage tab to the right sidebar the specs drive.
_labconfig = Path(tempfile.mkdtemp(prefix="gpucr-ui-labconfig-"))
(_labconfig / "labconfig").mkdir()
(_labconfig / "labconfig" / "page_config.json").write_text(
    json.dumps({"disabledExtensions": {"@jupyter-server/resource-usage": True}}))
os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
    p for p in (str(_labconfig), os.environ.get("JUPYTER_CONFIG_PATH")) if p)

_store = os.environ.get("GPUCR_UI_STORE") or tempfile.mkdtemp(prefix="gpucr-ui-store-")
os.environ["GPUCR_STORE"] = _store
c.GPUCR.store = _store  # noqa: F821
# Stopping the test server must not suspend the test kernels into the store.
c.GPUCR.suspend_on_stop = False  # noqa: F821

# Kernels get their own IPython directory: the default ~/.ipython/profile_default/history.sqlite
# is shared by every IPython on the machine, and CRIU refuses to restore a kernel whose open
# files changed size while it was on disk (another kernel wrote history meanwhile).
os.environ["IPYTHONDIR"] = os.environ.get("GPUCR_UI_IPYTHONDIR") or tempfile.mkdtemp(prefix="gpucr-ui-ipython-")

# User settings: a temporary directory, with JupyterLab's news/update prompts off (the
# toast asking about news would cover the UI under test).
_settings = Path(tempfile.mkdtemp(prefix="gpucr-ui-settings-"))
(_settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
(_settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
    json.dumps({"checkForUpdates": False, "fetchNews": "false"}))
c.LabApp.user_settings_dir = str(_settings)  # noqa: F821

c.ServerApp.log_level = os.environ.get("GPUCR_UI_LOG_LEVEL", "INFO")  # noqa: F821

# What the kernels hold, under a host memory budget (room.spec.ts).
c.GPUCR.host_memory_budget = "16GiB"  # noqa: F821
c.GPUCR.min_resident_s = 0  # noqa: F821

# Idle suspension for the python3-idle kernelspec only (idle timeouts are per kernelspec).
c.GPUCR.idle_timeout = 86400  # noqa: F821
c.GPUCR.idle_check_interval = 1  # noqa: F821
# The kernelspecs of python3-idle (its own idle timeout) and python3-room (its declared memory).
_kernels = Path(tempfile.mkdtemp(prefix="gpucr-ui-kernels-"))
_specs = {"python3-idle": ("Python 3 (suspended after 5 s unused)", {"gpucr_idle_timeout": 5}),
          "python3-room": ("Python 3 (declares 10 GiB)", {"gpucr_memory": "10GiB"})}
for _name, (_display, _metadata) in _specs.items():
    (_kernels / "kernels" / _name).mkdir(parents=True)
    (_kernels / "kernels" / _name / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": _display,
        "language": "python",
        "metadata": _metadata,
    }))
os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(_kernels), os.environ.get("JUPYTER_PATH")) if p)
