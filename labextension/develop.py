"""Link the installed JupyterLab extension to this checkout's build (like
`jupyter labextension develop`), so that `jlpm build` / `jlpm watch` changes
show up after a browser reload without reinstalling the Python package.

    python labextension/develop.py            # link into sys.prefix
    python labextension/develop.py --undo     # back to a copy (pip install -e . again)
"""
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE.parent / "jupyter_gpucr" / "labextension"
DEST = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyter-gpucr"


def main() -> int:
    if "--undo" in sys.argv[1:]:
        if DEST.is_symlink():
            DEST.unlink()
            print(f"removed the link {DEST}; reinstall with: pip install -e .")
        return 0
    if not (BUILD / "package.json").exists():
        print(f"no build in {BUILD}: run 'jlpm build' in labextension/ first", file=sys.stderr)
        return 1
    if DEST.is_symlink() or DEST.is_file():
        DEST.unlink()
    elif DEST.exists():
        shutil.rmtree(DEST)
    DEST.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "install.json", BUILD / "install.json")
    DEST.symlink_to(BUILD, target_is_directory=True)
    print(f"{DEST} -> {BUILD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
