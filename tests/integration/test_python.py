"""The Python package (docs/python.md) under the real mpirun: a plain PyTorch model with dropout and
LayerNorm (examples/train_mlp.py) trains to the same bits at W = 1, 2, 4 and to the same bits as
`culprit train` on its TorchScript export; a fault injected at one of its layers is named by
`culprit bisect` (which re-enters the script), a clean run gets "none"; audit and replay work on
its runs; scripts that break the contract are refused with one line and exit 2 on every rank."""
import json
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import culprit_testlib as testlib  # noqa: E402
from culprit_testlib import (EXIT_DIFFERS, EXIT_USAGE, HERE, MPIRUN, PY, ROOT, TIMEOUT, VERDICTS,  # noqa: E402
                             TempDirTest, run, run_each_rank_code)

EXAMPLE = os.path.join(ROOT, "examples", "train_mlp.py")
VARIANTS = os.path.join(HERE, "py_variants.py")
PKG = os.environ.get("CULPRIT_PYTHON_DIR", os.path.join(ROOT, "build", "python"))
SIZE = ["--global-batch", "32", "--micro-shards", "4", "--checkpoint-every", "2", "--keep-last", "10", "--quiet"]


def py_env(**extra):
    env = dict(os.environ, PYTHONPATH=PKG, CULPRIT_PYTHON_DIR=PKG)
    env.update(extra)
    return env


def run_script(script, args, world, env=None, cwd=None):
    """mpirun -np W python3 SCRIPT ARGS from cwd: (every rank's exit code, stdout, stderr)."""
    return run_each_rank_code(args, world, cwd, cwd=cwd, env=env or py_env(), program=[PY, script])


def metrics(run_dir):
    return [{k: m[k] for k in ("step", "loss", "grad_norm", "fingerprint")} for m in testlib.metrics(run_dir)]


class Python(TempDirTest):
    def train_script(self, name, world, extra=(), script=EXAMPLE, env=None, steps=6):
        """`mpirun -np WORLD python3 SCRIPT` trains the run `name`: its run directory."""
        run_dir = self.path(name)
        args = ["--run-dir", run_dir, "--steps", str(steps)] + SIZE + list(extra)
        codes, out, err = run_script(script, args, world, env, self.tmp)
        self.assertEqual(codes, [0] * world, out + err)
        return run_dir

    def test_same_bits_at_any_world_size_and_as_torchscript(self):
        runs = {w: metrics(self.train_script("w%d" % w, w, ["--trace", "layer"])) for w in (1, 2, 4)}
        self.assertEqual(len(runs[1]), 6)
        self.assertEqual(runs[1], runs[2])
        self.assertEqual(runs[1], runs[4])
        with open(os.path.join(self.path("w2"), "run.json")) as f:
            self.assertIn("model = python:%s:build" % EXAMPLE, json.load(f)["config"])
        # The same model exported as TorchScript, its data as HDF5: `culprit train` gives the same bits.
        subprocess.run([PY, EXAMPLE, "export", self.path("export")], check=True, env=py_env(), timeout=TIMEOUT)
        with open(self.path("export", "args")) as f:
            opt = f.read().split()
        ts = run(["train", "--model", "torchscript:" + self.path("export", "model.pt"), "--steps", "6",
                  "--data", "hdf5:" + self.path("export", "data.h5")] + opt + SIZE, world=2, run_dir=self.path("ts"))
        self.assertEqual(ts.code, 0, ts.err)
        self.assertEqual(metrics(self.path("ts")), runs[1])
        # The same run directory: checkpoints and trace agree bitwise with culprit train's.
        res = run(["audit", "--compare", self.path("w2"), self.path("ts")])
        self.assertEqual(res.code, 0, res.out + res.err)
        self.assertIn("checkpoints: 4 common, 2 compared; equal through step 6", res.out)
        self.assertIn("the runs agree bitwise everywhere they can be compared", res.out)
        # Negative control: another seed gives other bits (the comparison can fail).
        other = metrics(self.train_script("seed", 2, ["--seed", "99"]))
        self.assertNotEqual(other[-1]["fingerprint"], runs[1][-1]["fingerprint"])
        res = run(["audit", "--compare", self.path("seed"), self.path("ts")])
        self.assertEqual(res.code, EXIT_DIFFERS, res.out + res.err)
        self.assertIn("first differing step: 0", res.out)
        # The checkpoints are culprit's own: verify reads them clean.
        res = run(["verify", self.path("w2")])
        self.assertEqual(res.code, 0, res.out + res.err)

    def test_fault_at_a_layer_is_localised_and_clean_run_is_none(self):
        spec = "step=3,rank=1,layer=body.4,index=5,phase=forward,kind=bitflip,bit=22"
        bad = self.train_script("bad", 2, ["--trace", "layer", "--on-detect", "warn", "--inject", spec])
        got = self.bisect(bad, 2, "hardware-transient", env=py_env())
        self.assertEqual((got["verdict"], got["step"], got["phase"], got["layer"], got["rank"]),
                         ("hardware-transient", 3, "forward", "body.4", 1), got)
        clean = self.train_script("clean", 2, ["--trace", "layer"])
        self.bisect(clean, 2, "none", env=py_env())
        # audit replays every checkpoint interval of the clean run through the script, too.
        res = run(["audit", "--run-dir", clean], world=2, use_mpirun=True, env=py_env())
        self.assertEqual(res.code, 0, res.out + res.err)
        # replay of one step, as `python3 -m culprit`.
        proc = subprocess.run(MPIRUN + ["-np", "2", PY, "-m", "culprit", "replay", "--run-dir", clean, "--step", "4"],
                              capture_output=True, text=True, timeout=TIMEOUT, env=py_env())
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

    def test_a_batch_function_reads_as_the_indexable_data_set(self):
        by_index = self.train_script("ok", 2, script=VARIANTS, env=py_env(CULPRIT_VARIANT="ok"), steps=3)
        by_batch = self.train_script("batches", 2, script=VARIANTS, env=py_env(CULPRIT_VARIANT="batches"), steps=3)
        self.assertEqual(metrics(by_index), metrics(by_batch))
        self.assertEqual(len(metrics(by_batch)), 3)

    def test_a_build_that_changes_directory_moves_nothing(self):
        # A relative --run-dir, a build() that changes directory: the run stays where the command
        # line said, for training and for bisect re-entering the script; nothing lands elsewhere.
        elsewhere = self.path("elsewhere")
        os.makedirs(elsewhere)
        env = py_env(CULPRIT_VARIANT="chdir", CULPRIT_ELSEWHERE=elsewhere)
        args = ["--run-dir", "rel-run", "--steps", "3"] + SIZE
        codes, out, err = run_script(VARIANTS, args, 2, env, self.tmp)
        self.assertEqual(codes, [0, 0], out + err)
        self.assertEqual(len(metrics(self.path("rel-run"))), 3)
        codes, out, err = run_script(VARIANTS, ["bisect", "--run-dir", "rel-run"], 2, env, self.tmp)
        self.assertEqual(codes, [0, 0], out + err)
        self.assertIn("verdict: none", out)
        self.assertEqual(os.listdir(elsewhere), [])
        # The negative control: the same script run from `elsewhere` puts the run there.
        codes, out, err = run_script(VARIANTS, args, 1, env, elsewhere)
        self.assertEqual(codes, [0], out + err)
        self.assertEqual(len(metrics(os.path.join(elsewhere, "rel-run"))), 3)

    def test_a_script_that_hangs_is_not_a_stopped_rank(self):
        # Rank 1's loss never returns: the rank answers the roll call from the script's code, so it
        # is no stopped rank (exit 13 would exclude its healthy node): one line, exit 2, no incident
        # naming a host. The negative control: a stuck device (kind=hang, in culprit's layer hook
        # the script calls back) is silent and named, exit 13.
        for variant, inject, code, said in (
                ("hangs", [], testlib.EXIT_USAGE, "the script hangs"),
                ("ok", ["--inject", "step=3,rank=1,layer=2,phase=forward,kind=hang"], testlib.EXIT_SILENT_RANK,
                 "rank 1 (host")):
            with self.subTest(variant=variant):
                d = self.path("hang-" + variant)
                t0 = time.time()
                proc = subprocess.run(testlib.MPIRUN + ["-np", "2", PY, VARIANTS, "--run-dir", d, "--steps", "20",
                                                        "--collective-timeout", "5"] + SIZE + inject,
                                      env=py_env(CULPRIT_VARIANT=variant), capture_output=True, text=True, timeout=200)
                self.assertEqual(proc.returncode, code, proc.stdout + proc.stderr)
                self.assertLess(time.time() - t0, 60)
                lines = testlib.error_lines(proc.stderr)
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertIn(said, lines[0])
                named = [i["host"] for i in testlib.incidents(d) if i["detector"] == "collective-timeout" and i["host"]]
                self.assertEqual(len(named), 0 if variant == "hangs" else 1, testlib.incidents(d))

    def test_the_diagnosis_page_fits_long_layer_names(self):
        # nanoGPT-style names (transformer.h.0.attn.attn_dropout): the layer map's label column is
        # sized to the longest, no cell overlaps a name, and the page's checks hold (test_bisect.py).
        from test_bisect import check_report
        env = py_env(CULPRIT_VARIANT="long_names")
        layer = "transformer.h.0.attn.c_attn"
        d = self.train_script("long", 2, ["--inject", "step=3,rank=1,layer=%s,index=1,phase=forward,kind=bitflip,"
                                                      "bit=22,mode=persistent" % layer],
                              script=VARIANTS, env=env, steps=6)
        codes, out, err = run_script(VARIANTS, ["bisect", "--run-dir", d], 2, env, self.tmp)
        self.assertEqual(codes, [VERDICTS["hardware-persistent"]] * 2, out + err)
        got = testlib.diagnosis(d)
        self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (3, "forward", layer, 1), got)
        with open(os.path.join(d, "diagnosis.html")) as f:
            html = f.read()
        self.assertIn("transformer.h.0.attn.attn_dropout", html)
        check_report(self, html, 3, origin="forward " + layer)

    def test_optimizers_culprit_maps_train(self):
        for variant, kind in (("adamw_groups", "adamw"), ("sgd_nesterov_foreach", "sgd"), ("adam", "script"),
                              ("odd_step", "script")):
            with self.subTest(variant=variant):
                r = self.train_script(variant, 2, script=VARIANTS, env=py_env(CULPRIT_VARIANT=variant), steps=2)
                with open(os.path.join(r, "run.json")) as f:
                    config = json.load(f)["config"]
                self.assertIn("optimizer = " + kind, config)
                if kind != "script":
                    self.assertIn("weight-decay-params = " + ("matrices" if kind == "adamw" else "all"), config)
                else:  # the script's own object: its class and state recorded, its step() the update
                    self.assertIn("script-optimizer = " + ("Adam" if variant == "adam" else "SGD"), config)

    def test_contract_breaches_are_refused_on_every_rank(self):
        cases = [("noisy_data", "read twice gave different inputs"),
                 ("batchnorm", "updates state in its forward pass ('1.running_mean'"),
                 ("hidden_rng", "gave different initial parameters"),
                 ("random_step", "culprit needs a deterministic step"),
                 ("list_state", "keeps state 'history' as list"),
                 ("plateau", "ReduceLROnPlateau decides from the loss"),
                 ("two_schedules", "give scheduler= (a torch.optim.lr_scheduler) or lr_schedule="),
                 ("one_cycle", "changes 'betas' as well"),
                 ("sum_declared_mean", "the loss must be the mean over the samples as the Setup declares"),
                 ("vector_loss", "must return a 0-dim tensor"),
                 ("raises", "RuntimeError: the user's loss is broken"),
                 ("inplace_param", "changes its parameter 'fc.weight' in its forward pass"),
                 ("mean_loss", "the loss must be the sum over the samples"),
                 ("global_model", "returned a model it had returned before"),
                 ("seeding_data", "reading samples draws from (or seeds) torch's default random generator"),
                 ("rank_model", "rank 1 built other initial parameters than rank 0")]
        for variant, message in cases:
            with self.subTest(variant=variant):
                self.assert_refused(["--run-dir", self.path(variant), "--steps", "2", "--global-batch", "8",
                                     "--micro-shards", "2"], EXIT_USAGE, message, env=py_env(CULPRIT_VARIANT=variant),
                                    program=[PY, VARIANTS])
        # The executable alone cannot build a Python model: one line, naming the way that can.
        res = run(["train", "--model", "python:%s:build" % VARIANTS, "--data", "python", "--quiet"], world=2,
                  run_dir=self.path("exe"))
        self.assertEqual(res.code, EXIT_USAGE, res.err)
        self.assertIn("is built by a Python script: run it through the Python package", res.err)
        self.assert_refused(["--run-dir", self.path("lr"), "--lr", "0.3"], EXIT_USAGE,
                            "option '--lr' comes from the script's Setup", env=py_env(), program=[PY, VARIANTS])

    def test_exception_mid_run_on_one_rank_ends_the_job(self):
        start = time.time()
        proc = subprocess.run(MPIRUN + ["-np", "2", PY, VARIANTS, "--run-dir", self.path("r"), "--steps", "6",
                                        "--global-batch", "8", "--micro-shards", "2"], capture_output=True, text=True,
                              timeout=TIMEOUT, env=py_env(CULPRIT_VARIANT="raises_later"))
        self.assertNotEqual(proc.returncode, 0)
        self.assertLess(time.time() - start, 120)  # ended, not left waiting for --collective-timeout (300 s)
        self.assertIn("culprit: error: rank 1: the loss function raised RuntimeError: rank 1's loss broke mid-run",
                      proc.stderr)
        self.assertTrue(os.path.exists(self.path("r", "checkpoints")))  # what was written is kept

    def test_on_detect_diagnose_and_an_edited_script(self):
        script = self.path("train.py")  # a copy: this test edits it
        shutil.copy(EXAMPLE, script)
        spec = "step=4,rank=1,layer=body.0,index=3,phase=grad,kind=nan,mode=persistent"
        codes, out, err = run_script(script, ["--run-dir", self.path("d"), "--steps", "6"] + SIZE +
                                     ["--on-detect", "diagnose", "--inject", spec], 2, py_env(), self.tmp)
        self.assertEqual(codes, [VERDICTS["hardware-persistent"]] * 2, out + err)  # decided in the training job
        with open(self.path("d", "diagnosis.json")) as f:
            got = json.load(f)
        self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (4, "grad", "body.0", 1), got)
        # Resumed through the executable (it hands the run to the package), then the script is edited:
        clean = self.train_script("c", 2, script=script, steps=4)
        res = run(["train", "--resume", "--steps", "6", "--run-dir", clean, "--quiet"], world=2, env=py_env())
        self.assertEqual(res.code, 0, res.out + res.err)
        self.assertEqual(metrics(clean), metrics(self.train_script("whole", 2, script=script)))
        with open(script, "a") as f:
            f.write("# edited after training\n")
        res = run(["bisect", "--run-dir", clean], world=2, use_mpirun=True, env=py_env())
        self.assertEqual(res.code, EXIT_USAGE, res.out + res.err)
        self.assertIn("changed since the run was trained", res.err)

    def test_run_json_records_only_the_options_that_apply(self):
        # A Python run uses neither the built-in models' options nor synthetic or tokens data's:
        # run.json does not list them. A built-in mlp run still lists everything (unchanged).
        unused = ("hidden", "samples", "sample-shape", "layers", "width", "heads", "tie-head", "init", "seq-len",
                  "vocab", "token-dtype")

        def keys(run_dir):
            with open(os.path.join(run_dir, "run.json")) as f:
                return [line.split(" = ", 1)[0] for line in json.load(f)["config"].splitlines()]

        d = self.train_script("py", 2, steps=4)
        got = keys(d)
        self.assertIn("lr", got)
        self.assertIn("classes", got)  # labels of the script's data are checked against it
        for k in unused:
            self.assertNotIn(k, got)
        mlp = run(["train", "--model", "mlp", "--steps", "1", "--global-batch", "8", "--micro-shards", "2",
                   "--samples", "32", "--quiet"], world=1, run_dir=self.path("mlp"))
        self.assertEqual(mlp.code, 0, mlp.err)
        for k in unused:
            self.assertIn(k, keys(self.path("mlp")))
        # The run resumes (the checkpoints record the same), and an edited run.json is still refused.
        res = run(["train", "--resume", "--steps", "6", "--run-dir", d, "--quiet"], world=2, env=py_env())
        self.assertEqual(res.code, 0, res.out + res.err)
        path = os.path.join(d, "run.json")
        with open(path) as f:
            j = json.load(f)
        lr = next(l for l in j["config"].splitlines() if l.startswith("lr = "))
        j["config"] = j["config"].replace(lr, "lr = 0.5")
        with open(path, "w") as f:
            json.dump(j, f)
        res = run(["replay", "--step", "3", "--run-dir", d], world=2, env=py_env())
        self.assertEqual(res.code, testlib.EXIT_DAMAGED, res.out + res.err)
        self.assertIn("says --lr 0.5 but checkpoint", res.err)


if __name__ == "__main__":
    unittest.main()
