"""The package version, from the installed metadata; its one source is labextension/package.json
(hatch-nodejs-version), so the Python package and the JupyterLab extension never disagree."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jupyter-gpucr")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
