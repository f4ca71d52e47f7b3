"""python3 -m culprit COMMAND [options]: a culprit command on a run made from Python. The run's
script is re-entered (imported, not run as __main__) and its setup function rebuilds the model,
loss, data and optimizer; `culprit COMMAND` on such a run comes here by itself."""
import sys

from ._setup import run_module

if __name__ == "__main__":
    sys.exit(run_module(sys.argv[1:]))
