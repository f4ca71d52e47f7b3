"""The `culprit` command of an installed package (pyproject.toml's [project.scripts]): runs the
executable installed beside the module (culprit/bin/culprit), telling it which interpreter and
package re-enter a run made from Python (cli/culprit.cpp reads CULPRIT_PYTHON and
CULPRIT_PYTHON_DIR). Under mpirun every rank does the same: this process becomes the executable."""
import importlib.util
import os
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    exe = os.path.join(here, "bin", "culprit")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"culprit: error: {exe} is missing: this package was not installed by pip "
                         "(pip install . from culprit's source; docs/python.md)\n")
        return 2
    # The executable's run path finds torch/lib beside this package; torch installed elsewhere (a
    # user site, a base environment) is found as this interpreter finds it.
    torch = importlib.util.find_spec("torch")
    if torch is not None and torch.origin:
        lib = os.path.join(os.path.dirname(torch.origin), "lib")
        os.environ["LD_LIBRARY_PATH"] = lib + (os.pathsep + os.environ["LD_LIBRARY_PATH"]
                                               if os.environ.get("LD_LIBRARY_PATH") else "")
    os.environ["CULPRIT_PYTHON"] = sys.executable
    os.environ["CULPRIT_PYTHON_DIR"] = os.path.dirname(here)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
