"""The Python package as a package (docs/python.md, "Installing"): a fresh virtual environment holding
only torch gets culprit by `pip install` of the source tree — built against that environment's
torch — and then, with no PYTHONPATH and nothing of the build tree: `import culprit`, the `culprit`
command, `python -m culprit`, and examples/train_mlp.py under mpirun at W = 2 and alone at W = 1 to
the same bits, bisected by the installed command (which re-enters the script through the installed
package)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import MPIRUN, ROOT  # noqa: E402

TORCH = "torch==" + __import__("torch").__version__.split("+")[0]  # the build's own, from pip's cache
BUILD_TIMEOUT = int(os.environ.get("CULPRIT_PACKAGE_TIMEOUT", "1800"))


def clean_env(venv):
    """The environment a user's shell has in a fresh venv: its bin first, nothing of culprit's tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CULPRIT_PYTHON_DIR", "CULPRIT_PYTHON", "CULPRIT_BIN", "VIRTUAL_ENV")}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = venv
    return env


class Package(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="culprit-package-")
        cls.venv = os.path.join(cls.tmp, "venv")
        cls.env = clean_env(cls.venv)
        cls.py = os.path.join(cls.venv, "bin", "python")
        subprocess.run(["/usr/bin/python3", "-m", "venv", cls.venv], check=True)
        pip = [cls.py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + [TORCH], check=True, env=cls.env, timeout=BUILD_TIMEOUT)
        # The build tree of pip's build in the temporary directory, not in the source tree.
        build = subprocess.run(pip + ["--config-settings=build-dir=" + os.path.join(cls.tmp, "build"), ROOT],
                               env=cls.env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        cls.build_output = build.stdout + build.stderr
        cls.built = build.returncode == 0

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertTrue(self.built, self.build_output[-4000:])

    def run_in_venv(self, args, **kw):
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=600, cwd=self.tmp, **kw)

    def test_import_the_command_and_python_m(self):
        res = self.run_in_venv([self.py, "-c", "import culprit, os; print(os.path.dirname(culprit.__file__))"])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertTrue(res.stdout.strip().startswith(self.venv), res.stdout)  # the installed one
        culprit = os.path.join(self.venv, "bin", "culprit")
        res = self.run_in_venv([culprit, "--help"])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("bisect", res.stdout)
        res = self.run_in_venv([self.py, "-m", "culprit", "frobnicate"])
        self.assertEqual(res.returncode, 2, res.stdout + res.stderr)  # the command table's refusal
        self.assertIn("unknown command 'frobnicate'", res.stderr)

    def test_the_example_trains_to_the_same_bits_and_bisects(self):
        example = os.path.join(ROOT, "examples", "train_mlp.py")
        args = ["--steps", "6", "--global-batch", "32", "--micro-shards", "4", "--checkpoint-every", "2", "--quiet"]
        w2, w1 = os.path.join(self.tmp, "w2"), os.path.join(self.tmp, "w1")
        res = self.run_in_venv(MPIRUN + ["-np", "2", self.py, example, "--run-dir", w2] + args)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        res = self.run_in_venv([self.py, example, "--run-dir", w1] + args)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

        def fingerprints(d):
            with open(os.path.join(d, "metrics.jsonl")) as f:
                return [json.loads(line)["fingerprint"] for line in f]
        self.assertEqual(len(fingerprints(w2)), 6)
        self.assertEqual(fingerprints(w2), fingerprints(w1))
        # The installed command re-enters the script through the installed package: a clean run is none.
        res = self.run_in_venv(MPIRUN + ["-np", "2", os.path.join(self.venv, "bin", "culprit"), "bisect",
                                         "--run-dir", w2])
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        with open(os.path.join(w2, "diagnosis.json")) as f:
            self.assertEqual(json.load(f)["verdict"], "none")


if __name__ == "__main__":
    unittest.main(verbosity=2)
