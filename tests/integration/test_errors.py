"""Bad input: one clear line naming the problem, a nonzero exit on every rank, no hang, no trace."""
import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, run, run_each_rank_code  # noqa: E402

PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))


class Errors(TempDirTest):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        with h5py.File(self.path("flat.h5"), "w") as f:
            f["x"] = rng.standard_normal((64, 7)).astype(np.float32)
            f["y"] = rng.integers(0, 3, 64)
        with h5py.File(self.path("only_x.h5"), "w") as f:
            f["x"] = rng.standard_normal((64, 7)).astype(np.float32)
        with h5py.File(self.path("mismatch.h5"), "w") as f:
            f["x"] = rng.standard_normal((64, 7)).astype(np.float32)
            f["y"] = rng.integers(0, 3, 60)
        with h5py.File(self.path("neg.h5"), "w") as f:
            f["x"] = rng.standard_normal((64, 7)).astype(np.float32)
            f["y"] = -rng.integers(1, 3, 64)
        with open(self.path("flat.h5"), "rb") as f:
            blob = f.read()
        with open(self.path("truncated.h5"), "wb") as f:
            f.write(blob[: len(blob) // 2])
        with open(self.path("text.h5"), "w") as f:
            f.write("not hdf5\n")
        with open(self.path("bad.ini"), "w") as f:
            f.write("steps = 3\nno-such-option = 1\n")
        subprocess.run([PY, os.path.join(HERE, "scripted_models.py"), "mlp_dropout", self.path("net.pt")], check=True)
        subprocess.run([PY, os.path.join(HERE, "scripted_models.py"), "mlp_bn", self.path("bn.pt")], check=True)
        os.makedirs(self.path("used"))
        with open(self.path("used", "run.json"), "w") as f:
            f.write("{}\n")

    def expect_error(self, args, needle, world=2):
        """Runs on `world` ranks; every rank must exit nonzero and stderr must say `needle` once."""
        workdir = self.path("w%d" % abs(hash(tuple(args))))
        os.makedirs(workdir, exist_ok=True)
        codes, out, err = run_each_rank_code(["train"] + args, world, workdir, timeout=120)
        lines = [l for l in err.splitlines() if l.startswith("culprit: error:")]
        self.assertTrue(all(c != 0 for c in codes), "exit codes %s for %s\n%s" % (codes, args, err))
        self.assertEqual(len(lines), 1, "want one error line for %s, got:\n%s" % (args, err))
        self.assertIn(needle, lines[0])
        for marker in ("terminate called", "Exception raised from", "Segmentation", "Traceback"):
            self.assertNotIn(marker, err)
        return lines[0]

    def expect_bad_input(self, args, option, valid, world=2, command="train"):
        """Every rank exits 2 (bad input); the one error line names `option` and its `valid` range."""
        workdir = self.path("b%d" % abs(hash((command,) + tuple(args))))
        os.makedirs(workdir, exist_ok=True)
        codes, out, err = run_each_rank_code([command] + args, world, workdir, timeout=120)
        lines = [l for l in err.splitlines() if l.startswith("culprit: error:")]
        self.assertEqual(codes, [2] * world, "exit codes %s for %s\n%s" % (codes, args, err))
        self.assertEqual(len(lines), 1, "want one error line for %s, got:\n%s" % (args, err))
        self.assertIn(option, lines[0])
        self.assertIn(valid, lines[0])
        for marker in ("terminate called", "Exception raised from", "Segmentation", "Traceback", "Aborted"):
            self.assertNotIn(marker, err)
        return lines[0]

    def rd(self, name="run"):
        return ["--run-dir", self.path(name)]

    def test_options(self):
        self.expect_error(self.rd() + ["--bogus"], "unrecognised option '--bogus'")
        self.expect_error(self.rd() + ["--steps", "abc"], "--steps")
        self.expect_error(["--steps", "2"], "'--run-dir' is required")
        self.expect_error(self.rd() + ["--steps", "0"], "'--steps' must be in [1, 1000000000], got 0")
        self.expect_error(self.rd() + ["--model", "resnet"], "unknown model 'resnet'")
        self.expect_error(self.rd() + ["--data", "csv:x"], "unknown data source 'csv:x'")
        self.expect_error(self.rd() + ["--optimizer", "lion"], "unknown optimizer 'lion'")
        self.expect_error(self.rd() + ["--betas", "0.9"], "'--betas' needs two numbers")
        self.expect_error(self.rd() + ["--nesterov", "--momentum", "0"], "'--nesterov' needs --momentum > 0")
        self.expect_error(self.rd() + ["--config", self.path("missing.ini")], "config file")
        self.expect_error(self.rd() + ["--config", self.path("bad.ini")], "no-such-option")
        self.expect_error(self.rd() + ["--device", "gpu"], "unknown device 'gpu' (valid: cpu, cuda)")
        self.expect_error(self.rd() + ["--checkpoint-writers-per-host", "-2"],
                          "'--checkpoint-writers-per-host' must be in [0, 1024], got -2")

    def test_device_cuda_without_cuda(self):
        # Debian's libtorch is CPU-only: --device cuda is refused plainly on every rank (with a
        # CUDA-enabled libtorch and no GPU it names the host instead; bench/gpu-check.sh trains on one).
        torch_has_cuda = subprocess.run([PY, "-c", "import torch; print(torch.cuda.is_available())"],
                                        capture_output=True, text=True).stdout.strip() == "True"
        if torch_has_cuda:
            self.skipTest("a GPU is visible: bench/gpu-check.sh covers --device cuda")
        line = self.expect_error(self.rd() + ["--device", "cuda", "--steps", "2"], "--device cuda:")
        self.assertRegex(line, r"libtorch without CUDA|no CUDA device is visible on host")

    def test_shards_and_world(self):
        self.expect_error(self.rd() + ["--micro-shards", "2", "--global-batch", "8"],
                          "world size 3 exceeds --micro-shards 2", world=3)
        self.expect_error(self.rd() + ["--micro-shards", "6", "--global-batch", "12"], "must be a power of two")
        self.expect_error(self.rd() + ["--micro-shards", "4", "--global-batch", "30"],
                          "--global-batch 30 is not divisible by --micro-shards 4")
        self.expect_error(self.rd() + ["--samples", "16", "--global-batch", "32"],
                          "--global-batch 32 exceeds the 16 samples")

    def test_files(self):
        self.expect_error(self.rd() + ["--data", "hdf5:" + self.path("nope.h5")], "does not exist")
        self.expect_error(self.rd() + ["--data", "hdf5:" + self.path("text.h5")], "is not an HDF5 file")
        self.expect_error(self.rd() + ["--data", "hdf5:" + self.path("truncated.h5")], "truncated.h5")
        self.expect_error(self.rd() + ["--data", "hdf5:" + self.path("only_x.h5")], "has no dataset 'y'")
        self.expect_error(self.rd() + ["--data", "hdf5:" + self.path("mismatch.h5")],
                          "x has 64 samples but y has 60")
        self.expect_error(self.rd() + ["--data", "hdf5:" + self.path("neg.h5")], "negative class label")
        self.expect_error(self.rd() + ["--model", "torchscript:" + self.path("nope.pt")], "does not exist")
        self.expect_error(self.rd() + ["--model", "torchscript:" + self.path("flat.h5")],
                          "cannot load TorchScript module")
        self.expect_error(["--run-dir", self.path("used")], "already holds a run")

    def test_shape_mismatch(self):
        flat = ["--data", "hdf5:" + self.path("flat.h5"), "--global-batch", "16"]
        self.expect_error(self.rd() + ["--model", "cnn"] + flat, "model cnn needs samples of shape [C,H,W]")
        self.expect_error(self.rd() + ["--model", "gpt"] + flat, "model gpt needs int64 token sequences")
        self.expect_error(self.rd() + ["--model", "torchscript:" + self.path("net.pt")] + flat,
                          "does not accept samples of shape [7]")

    def test_stateful_forward_is_refused(self):
        # Batch-norm running statistics would depend on which micro-shards each rank computed.
        self.expect_error(self.rd() + ["--model", "torchscript:" + self.path("bn.pt"), "--sample-shape", "32",
                                       "--classes", "10"],
                          "updates state in its forward pass ('bn.running_mean'")

    def test_numbers_out_of_range(self):
        # Each was an abort, a hang or silently accepted (issue 15): now exit 2 on every rank.
        self.expect_bad_input(["--threads", "0"], "'--threads'", "must be in [1, ", command="screen")
        self.expect_bad_input(["--threads", "100000"], "'--threads'", "the system reports", command="screen")
        self.expect_bad_input(self.rd() + ["--threads", "100000"], "'--threads'", "the system reports")
        self.expect_bad_input(self.rd() + ["--hidden", "100000000"], "'--hidden'", "must be in [1, 1048576]")
        self.expect_bad_input(self.rd() + ["--collective-timeout", "1e-9"], "'--collective-timeout'",
                              "0 (wait forever) or a finite number in [1, 604800], got 1e-09")
        self.expect_bad_input(self.rd() + ["--spike-z", "nan"], "'--spike-z'", "finite number in [0, 1000000], got nan")
        self.expect_bad_input(self.rd() + ["--lr", "inf"], "'--lr'", "finite number in [0, 1000000]")
        self.expect_bad_input(self.rd() + ["--eps", "0"], "'--eps'", "in (0, 1], got 0")
        self.expect_bad_input(self.rd() + ["--samples", "1e12"], "'--samples'", "it must be in [1, 1099511627776]")
        self.expect_bad_input(["--run-dir", "r", "--reruns", "0"], "'--reruns'", "must be in [1, 1000]", command="bisect")
        self.expect_bad_input(["--run-dir", "r", "--step", "0"], "'--step'", "must be in [1, 1000000000]", command="replay")
        self.assertFalse(os.path.exists(self.path("run")))  # refused before the run directory is made
        # --inject is checked against the model's layers, once the model is built.
        self.expect_bad_input(self.rd("inj") + ["--inject", "step=1e30,rank=0,phase=data"], "--inject: step",
                              "an integer in [1, 1000000000], got 1e30")

    def test_sizes_that_do_not_fit_memory(self):
        # In range one by one, too large together: the estimate and the machine's memory, before any
        # allocation (was std::bad_alloc, or a run that went on).
        for args, option in ((["--samples", "999999999999"], "--samples 999999999999"),
                             (["--sample-shape", "100000,100000"], "--sample-shape [100000,100000]"),
                             (["--hidden", "1000000"], "--hidden 1000000")):
            line = self.expect_bad_input(self.rd() + args, option, "of memory the system reports")
            self.assertRegex(line, r"needs about [0-9.]+ [KMGTPE]iB per rank, more than the [0-9.]+ GiB")
        self.assertFalse(os.path.exists(self.path("run")))

    def test_config_is_a_regular_file_of_bounded_size(self):
        os.mkfifo(self.path("fifo.ini"))
        with open(self.path("big.ini"), "w") as f:
            f.write("#" * ((1 << 20) + 1))
        os.symlink(self.path("bad.ini"), self.path("link.ini"))
        for path, what in ((self.tmp, "is a directory"), ("/dev/zero", "is a character device"),
                           (self.path("fifo.ini"), "is a fifo"), (self.path("big.ini"), "more than the 1048576")):
            self.expect_bad_input(self.rd() + ["--config", path], "config file '%s'" % path, what)
        self.expect_error(self.rd() + ["--config", self.path("link.ini")], "no-such-option")  # a link is followed

    def test_labels_and_inputs_checked_at_load(self):
        rng = np.random.default_rng(1)
        x = rng.standard_normal((64, 32)).astype(np.float32)
        y = rng.integers(0, 4, 64)
        y[9] = 1000
        with h5py.File(self.path("wide.h5"), "w") as f:
            f["x"], f["y"] = x, y
        y[9] = 1 << 40
        with h5py.File(self.path("huge.h5"), "w") as f:
            f["x"], f["y"] = x, y
        y[9] = 12
        with h5py.File(self.path("twelve.h5"), "w") as f:
            f["x"], f["y"] = x, y
        y[9] = 1
        x[5, 3] = np.nan
        with h5py.File(self.path("nan.h5"), "w") as f:
            f["x"], f["y"] = x, y
        data = lambda name: ["--data", "hdf5:" + self.path(name), "--global-batch", "16"]
        self.expect_bad_input(self.rd() + data("wide.h5") + ["--classes", "4"], "y holds class label 1000 at sample 9",
                              "valid class labels are [0, 4) with --classes 4")
        self.expect_bad_input(self.rd() + data("huge.h5"), "y holds class label 1099511627776 at sample 9",
                              "valid class labels are [0, 1048576) (give --classes C")
        self.expect_bad_input(self.rd() + data("nan.h5"), "x holds a non-finite value (nan) in sample 5", "element 3")
        # A TorchScript module's output width (10) is known after its first forward, at setup.
        net = ["--model", "torchscript:" + self.path("net.pt")]
        self.expect_bad_input(self.rd() + net + data("twelve.h5"), "scores 10 classes",
                              "class labels must be in [0, 10): data hdf5:%s y holds label 12 at sample 9"
                              % self.path("twelve.h5"))
        self.expect_bad_input(self.rd() + net + data("wide.h5")[:2] + ["--classes", "11", "--global-batch", "16"],
                              "y holds class label 1000", "[0, 11) with --classes 11")
        # gpt: --vocab bounds every token id of x and every target of y.
        tokens = rng.integers(0, 40, (64, 8))
        tokens[3, 2] = 50
        with h5py.File(self.path("tokens.h5"), "w") as f:
            f["x"], f["y"] = tokens, np.roll(tokens, -1, axis=1) % 40
        self.expect_bad_input(self.rd() + ["--model", "gpt", "--vocab", "40"] + data("tokens.h5"),
                              "x holds token id 50 at sample 3 (position 2)", "valid token ids are [0, 40) with --vocab 40")
        self.expect_bad_input(self.rd() + ["--model", "gpt", "--vocab", "30"] + data("tokens.h5"),
                              "y holds class label", "[0, 30) with --vocab 30")
        self.expect_bad_input(self.rd() + ["--model", "gpt", "--seq-len", "16"] + data("tokens.h5"),
                              "option '--seq-len' is 16 but data hdf5:", "holds sequences of 8 tokens")

    def test_a_data_file_claiming_more_than_memory(self):
        # A chunked, compressed dataset claims 4 TiB in a file of a few KiB: its chunks were never
        # written, so it is refused at open (no sample is read; was an abort in allocation when
        # the whole data set was loaded).
        with h5py.File(self.path("claims.h5"), "w") as f:
            f.create_dataset("x", shape=(1 << 20, 1 << 20), dtype=np.float32, chunks=(64, 64), compression="gzip")
            f.create_dataset("y", shape=(1 << 20,), dtype=np.int64, chunks=(4096,), compression="gzip")
        self.assertLess(os.path.getsize(self.path("claims.h5")), 1 << 20)
        self.expect_bad_input(self.rd() + ["--data", "hdf5:" + self.path("claims.h5")], "dataset 'x'",
                              "stores 0 of its 268435456 chunks: the others were never written")

    def test_single_process_without_mpirun(self):
        res = run(["train", "--micro-shards", "3"], run_dir=self.path("single"))
        self.assertEqual(res.code, 2)
        self.assertIn("culprit: error: option '--micro-shards' must be a power of two", res.err)
        res = run(["frobnicate"])
        self.assertEqual(res.code, 2)
        self.assertIn("unknown command 'frobnicate'", res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
