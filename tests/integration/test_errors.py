"""Bad input: one clear line naming the problem, a nonzero exit on every rank, no hang, no trace."""
import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (CRASH_MARKERS, CULPRIT, EXIT_USAGE, MPIRUN, PY, TempDirTest, error_lines,  # noqa: E402
                             make_scripted_model, run)


class Errors(TempDirTest):
    REFUSAL_TIMEOUT = 120  # bad input is refused at once: longer is a hang

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
        make_scripted_model(self.path("net.pt"), "mlp_dropout")
        make_scripted_model(self.path("bn.pt"), "mlp_bn")
        os.makedirs(self.path("used"))
        with open(self.path("used", "run.json"), "w") as f:
            f.write("{}\n")

    def rd(self, name="run"):
        return ["--run-dir", self.path(name)]

    def test_options(self):
        self.assert_refused(["train"] + self.rd() + ["--bogus"], EXIT_USAGE, "unrecognised option '--bogus'")
        self.assert_refused(["train"] + self.rd() + ["--steps", "abc"], EXIT_USAGE, "--steps")
        self.assert_refused(["train", "--steps", "2"], EXIT_USAGE, "'--run-dir' is required")
        self.assert_refused(["train"] + self.rd() + ["--steps", "0"], EXIT_USAGE,
                            "'--steps' must be in [1, 1000000000], got 0")
        self.assert_refused(["train"] + self.rd() + ["--model", "resnet"], EXIT_USAGE, "unknown model 'resnet'")
        self.assert_refused(["train"] + self.rd() + ["--data", "csv:x"], EXIT_USAGE, "unknown data source 'csv:x'")
        self.assert_refused(["train"] + self.rd() + ["--optimizer", "lion"], EXIT_USAGE, "unknown optimizer 'lion'")
        self.assert_refused(["train"] + self.rd() + ["--betas", "0.9"], EXIT_USAGE, "'--betas' needs two numbers")
        self.assert_refused(["train"] + self.rd() + ["--nesterov", "--momentum", "0"], EXIT_USAGE,
                            "'--nesterov' needs --momentum > 0")
        self.assert_refused(["train"] + self.rd() + ["--config", self.path("missing.ini")], EXIT_USAGE, "config file")
        self.assert_refused(["train"] + self.rd() + ["--config", self.path("bad.ini")], EXIT_USAGE, "no-such-option")
        self.assert_refused(["train"] + self.rd() + ["--device", "gpu"], EXIT_USAGE,
                            "unknown device 'gpu' (valid: cpu, cuda)")
        self.assert_refused(["train"] + self.rd() + ["--checkpoint-writers-per-host", "-2"], EXIT_USAGE,
                            "'--checkpoint-writers-per-host' must be in [0, 1024], got -2")

    def test_inject_specs_are_refused_by_form_before_anything_is_written(self):
        base = "rank=0,layer=fc1,phase=forward,kind=bitflip"
        for spec, want in [("step=0x3," + base, "step=0x3 is not a decimal number"),
                           ("step=3," + base + ",", "has an empty item (a leading, trailing or doubled comma)"),
                           ("step=3,," + base, "has an empty item"),
                           ("step=3,step=4," + base, "key 'step' is given twice"),
                           ("step=3,bit=inf," + base, "bit=inf is not a decimal number"),
                           ("step=3," + ",".join(["rank=0"] * 10000) + ",layer=fc1,phase=forward",
                            "key 'rank' is given twice")]:
            with self.subTest(spec=spec[:40]):
                self.assert_refused(["train"] + self.rd("inj") + ["--steps", "2", "--inject", spec], EXIT_USAGE, want)
                self.assertFalse(os.path.exists(self.path("inj")), "the run directory was made before the refusal")
        many = ["--inject", "step=3,rank=0,layer=fc1,index=123456,phase=forward,kind=bitflip,bit=3"] * 400
        self.assert_refused(["train"] + self.rd("inj") + ["--steps", "2"] + many, EXIT_USAGE,
                            "400 fault(s) of", "more than 16384")
        self.assertFalse(os.path.exists(self.path("inj")))
        # Negative control: the same fault, well formed, trains.
        r = run(["train", "--steps", "2", "--quiet", "--on-detect", "warn", "--inject", "step=1," + base],
                run_dir=self.path("ok"))
        self.assertEqual(r.code, 0, r.err)

    def test_device_cuda_without_cuda(self):
        # The wheel's libtorch is a CUDA build and this machine has no GPU: --device cuda is refused
        # plainly on every rank, naming the host and the CUDA runtime's reason (a CPU-only libtorch
        # says so instead; bench/gpu-check.sh trains on a GPU).
        torch_has_cuda = subprocess.run([PY, "-c", "import torch; print(torch.cuda.is_available())"],
                                        capture_output=True, text=True).stdout.strip() == "True"
        if torch_has_cuda:
            self.skipTest("a GPU is visible: bench/gpu-check.sh covers --device cuda")
        line = self.assert_refused(["train"] + self.rd() + ["--device", "cuda", "--steps", "2"], EXIT_USAGE,
                                   "--device cuda:")
        self.assertRegex(line, r"libtorch without CUDA|no CUDA device is visible on host \S+ \(.+\)")

    def test_shards_and_world(self):
        self.assert_refused(["train"] + self.rd() + ["--micro-shards", "2", "--global-batch", "8"], EXIT_USAGE,
                            "world size 3 exceeds --micro-shards 2", world=3)
        self.assert_refused(["train"] + self.rd() + ["--micro-shards", "6", "--global-batch", "12"], EXIT_USAGE,
                            "must be a power of two")
        self.assert_refused(["train"] + self.rd() + ["--micro-shards", "4", "--global-batch", "30"], EXIT_USAGE,
                            "--global-batch 30 is not divisible by --micro-shards 4")
        self.assert_refused(["train"] + self.rd() + ["--samples", "16", "--global-batch", "32"], EXIT_USAGE,
                            "--global-batch 32 exceeds the 16 samples")

    def test_files(self):
        cases = [(["--data", "hdf5:" + self.path("nope.h5")], "does not exist"),
                 (["--data", "hdf5:" + self.path("text.h5")], "is not an HDF5 file"),
                 (["--data", "hdf5:" + self.path("truncated.h5")], "truncated.h5"),
                 (["--data", "hdf5:" + self.path("only_x.h5")], "has no dataset 'y'"),
                 (["--data", "hdf5:" + self.path("mismatch.h5")], "x has 64 samples but y has 60"),
                 (["--data", "hdf5:" + self.path("neg.h5")], "negative class label"),
                 (["--model", "torchscript:" + self.path("nope.pt")], "does not exist"),
                 (["--model", "torchscript:" + self.path("flat.h5")], "cannot load TorchScript module")]
        for args, want in cases:
            with self.subTest(args=args):
                self.assert_refused(["train"] + self.rd() + args, EXIT_USAGE, want)
        self.assert_refused(["train", "--run-dir", self.path("used")], EXIT_USAGE, "already holds a run")

    def test_shape_mismatch(self):
        flat = ["--data", "hdf5:" + self.path("flat.h5"), "--global-batch", "16"]
        self.assert_refused(["train"] + self.rd() + ["--model", "cnn"] + flat, EXIT_USAGE,
                            "model cnn needs samples of shape [C,H,W]")
        self.assert_refused(["train"] + self.rd() + ["--model", "gpt"] + flat, EXIT_USAGE,
                            "model gpt needs int64 token sequences")
        self.assert_refused(["train"] + self.rd() + ["--model", "torchscript:" + self.path("net.pt")] + flat,
                            EXIT_USAGE, "does not accept samples of shape [7]")

    def test_stateful_forward_is_refused(self):
        # Batch-norm running statistics would depend on which micro-shards each rank computed.
        self.assert_refused(["train"] + self.rd() + ["--model", "torchscript:" + self.path("bn.pt"), "--sample-shape",
                                                     "32", "--classes", "10"],
                            EXIT_USAGE, "updates state in its forward pass ('bn.running_mean'")

    def test_numbers_out_of_range(self):
        # Each was an abort, a hang or silently accepted (issue 15): now exit 2 on every rank.
        self.assert_refused(["screen", "--threads", "0"], EXIT_USAGE, "'--threads'", "must be in [1, ")
        self.assert_refused(["screen", "--threads", "100000"], EXIT_USAGE, "'--threads'", "the system reports")
        self.assert_refused(["train"] + self.rd() + ["--threads", "100000"], EXIT_USAGE, "'--threads'",
                            "the system reports")
        self.assert_refused(["train"] + self.rd() + ["--hidden", "100000000"], EXIT_USAGE, "'--hidden'",
                            "must be in [1, 1048576]")
        self.assert_refused(["train"] + self.rd() + ["--collective-timeout", "1e-9"], EXIT_USAGE,
                            "'--collective-timeout'", "0 (wait forever) or a finite number in [1, 604800], got 1e-09")
        self.assert_refused(["train"] + self.rd() + ["--spike-z", "nan"], EXIT_USAGE, "'--spike-z'",
                            "finite number in [0, 1000000], got nan")
        self.assert_refused(["train"] + self.rd() + ["--lr", "inf"], EXIT_USAGE, "'--lr'",
                            "finite number in [0, 1000000]")
        self.assert_refused(["train"] + self.rd() + ["--eps", "0"], EXIT_USAGE, "'--eps'", "in (0, 1], got 0")
        self.assert_refused(["train"] + self.rd() + ["--samples", "1e12"], EXIT_USAGE, "'--samples'",
                            "it must be in [1, 1099511627776]")
        self.assert_refused(["bisect", "--run-dir", "r", "--reruns", "0"], EXIT_USAGE, "'--reruns'",
                            "must be in [1, 1000]")
        self.assert_refused(["replay", "--run-dir", "r", "--step", "0"], EXIT_USAGE, "'--step'",
                            "must be in [1, 1000000000]")
        self.assertFalse(os.path.exists(self.path("run")))  # refused before the run directory is made
        # --inject is checked against the model's layers, once the model is built.
        self.assert_refused(["train"] + self.rd("inj") + ["--inject", "step=1e30,rank=0,phase=data"], EXIT_USAGE,
                            "--inject: step", "an integer in [1, 1000000000], got 1e30")

    def test_sizes_that_do_not_fit_memory(self):
        # In range one by one, too large together: the estimate and the machine's memory, before any
        # allocation (was std::bad_alloc, or a run that went on).
        for args, option in ((["--samples", "999999999999"], "--samples 999999999999"),
                             (["--sample-shape", "100000,100000"], "--sample-shape [100000,100000]"),
                             (["--hidden", "1000000"], "--hidden 1000000")):
            line = self.assert_refused(["train"] + self.rd() + args, EXIT_USAGE, option, "of memory the system reports")
            self.assertRegex(line, r"needs about [0-9.]+ [KMGTPE]iB per rank, more than the [0-9.]+ GiB")
        self.assertFalse(os.path.exists(self.path("run")))

    def test_an_address_space_limit_is_one_line(self):
        # Under `ulimit -v` (RLIMIT_AS): a run the estimate sees cannot fit is refused before it
        # allocates, naming the limit; one whose allocation fails later (a batch the estimate does
        # not count) ends with one line per failing rank, exit 2, never a crash or a hang. The
        # negative control: a small run under the same limit trains.
        limit = 3560000  # KiB: libtorch 2.11 (with its CUDA libraries), MPI and culprit map about 3.0 GiB
        # of address space before the first step (not resident: the CUDA libraries are mapped, unused)
        for name, args, said in (
                ("estimate", ["--model", "gpt", "--layers", "2", "--width", "1024", "--heads", "8", "--seq-len", "32",
                              "--vocab", "8192"], "more than the"),
                ("later", ["--model", "mlp", "--hidden", "2048", "--samples", "70000", "--global-batch", "65536"],
                 "out of memory"),
                ("fits", ["--model", "mlp"], None)):
            with self.subTest(case=name):
                cmd = " ".join(MPIRUN + ["-np", "2", CULPRIT, "train", "--quiet", "--steps", "2"] + self.rd(name) + args)
                proc = subprocess.run(["bash", "-c", "ulimit -v %d; exec %s" % (limit, cmd)], capture_output=True,
                                      text=True, timeout=self.REFUSAL_TIMEOUT)
                if said is None:
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    continue
                self.assertEqual(proc.returncode, EXIT_USAGE, proc.stderr)
                lines = error_lines(proc.stderr)
                self.assertTrue(1 <= len(lines) <= 2, proc.stderr)
                for line in lines:
                    self.assertIn(said, line)
                    self.assertIn("ulimit -v", line)
                for marker in CRASH_MARKERS:
                    self.assertNotIn(marker, proc.stderr)

    def test_running_out_of_file_descriptors_is_an_io_failure(self):
        # Each rank under `ulimit -n N` (mpirun itself needs more; below 19 Open MPI's own start-up
        # and libtorch's seeding fail before culprit runs anything): whichever open fails first —
        # the run's own files, libtorch's, MPI-IO's own at a checkpoint's collective open, which
        # hangs the collective — the job ends with exit 6 and one line, never as a silent rank (13),
        # an internal error or a crash. Enough descriptors: it trains (the negative control).
        codes = {}
        for n in range(19, 25):
            with self.subTest(limit=n):
                proc = subprocess.run(MPIRUN + ["-np", "2", "sh", "-c", "ulimit -n %d; exec \"$0\" \"$@\"" % n, CULPRIT,
                                                "train", "--quiet", "--steps", "20", "--checkpoint-every", "5",
                                                "--collective-timeout", "5"] + self.rd("fd%d" % n),
                                      capture_output=True, text=True, timeout=self.REFUSAL_TIMEOUT)
                codes[n] = proc.returncode
                if proc.returncode == 0:
                    continue
                self.assertEqual(proc.returncode, 6, proc.stderr)
                lines = error_lines(proc.stderr)
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertRegex(lines[0], r"Too many open files|out of file descriptors")
                for marker in CRASH_MARKERS:
                    self.assertNotIn(marker, proc.stderr)
        self.assertIn(6, codes.values(), codes)
        self.assertEqual(codes[24], 0, codes)

    def test_config_is_a_regular_file_of_bounded_size(self):
        os.mkfifo(self.path("fifo.ini"))
        with open(self.path("big.ini"), "w") as f:
            f.write("#" * ((1 << 20) + 1))
        os.symlink(self.path("bad.ini"), self.path("link.ini"))
        for path, what in ((self.tmp, "is a directory"), ("/dev/zero", "is a character device"),
                           (self.path("fifo.ini"), "is a fifo"), (self.path("big.ini"), "more than the 1048576")):
            self.assert_refused(["train"] + self.rd() + ["--config", path], EXIT_USAGE, "config file '%s'" % path, what)
        # A link is followed.
        self.assert_refused(["train"] + self.rd() + ["--config", self.path("link.ini")], EXIT_USAGE, "no-such-option")

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
        self.assert_refused(["train"] + self.rd() + data("wide.h5") + ["--classes", "4"], EXIT_USAGE,
                            "y holds class label 1000 at sample 9", "valid class labels are [0, 4) with --classes 4")
        self.assert_refused(["train"] + self.rd() + data("huge.h5"), EXIT_USAGE,
                            "y holds class label 1099511627776 at sample 9",
                            "valid class labels are [0, 1048576) (give --classes C")
        self.assert_refused(["train"] + self.rd() + data("nan.h5"), EXIT_USAGE,
                            "x holds a non-finite value (nan) in sample 5", "element 3")
        # A TorchScript module's output width (10) is known after its first forward, at setup.
        net = ["--model", "torchscript:" + self.path("net.pt")]
        self.assert_refused(["train"] + self.rd() + net + data("twelve.h5"), EXIT_USAGE, "scores 10 classes",
                            "class labels must be in [0, 10): data hdf5:%s y holds label 12 at sample 9"
                            % self.path("twelve.h5"))
        self.assert_refused(["train"] + self.rd() + net + data("wide.h5")[:2] + ["--classes", "11", "--global-batch",
                                                                                 "16"],
                            EXIT_USAGE, "y holds class label 1000", "[0, 11) with --classes 11")
        # gpt: --vocab bounds every token id of x and every target of y.
        tokens = rng.integers(0, 40, (64, 8))
        tokens[3, 2] = 50
        with h5py.File(self.path("tokens.h5"), "w") as f:
            f["x"], f["y"] = tokens, np.roll(tokens, -1, axis=1) % 40
        self.assert_refused(["train"] + self.rd() + ["--model", "gpt", "--vocab", "40"] + data("tokens.h5"), EXIT_USAGE,
                            "x holds token id 50 at sample 3 (position 2)",
                            "valid token ids are [0, 40) with --vocab 40")
        self.assert_refused(["train"] + self.rd() + ["--model", "gpt", "--vocab", "30"] + data("tokens.h5"), EXIT_USAGE,
                            "y holds class label", "[0, 30) with --vocab 30")
        self.assert_refused(["train"] + self.rd() + ["--model", "gpt", "--seq-len", "16"] + data("tokens.h5"),
                            EXIT_USAGE, "option '--seq-len' is 16 but data hdf5:", "holds sequences of 8 tokens")

    def test_a_data_file_claiming_more_than_memory(self):
        # A chunked, compressed dataset claims 4 TiB in a file of a few KiB: its chunks were never
        # written, so it is refused at open (no sample is read; was an abort in allocation when
        # the whole data set was loaded).
        with h5py.File(self.path("claims.h5"), "w") as f:
            f.create_dataset("x", shape=(1 << 20, 1 << 20), dtype=np.float32, chunks=(64, 64), compression="gzip")
            f.create_dataset("y", shape=(1 << 20,), dtype=np.int64, chunks=(4096,), compression="gzip")
        self.assertLess(os.path.getsize(self.path("claims.h5")), 1 << 20)
        self.assert_refused(["train"] + self.rd() + ["--data", "hdf5:" + self.path("claims.h5")], EXIT_USAGE,
                            "dataset 'x'", "stores 0 of its 268435456 chunks: the others were never written")

    def test_single_process_without_mpirun(self):
        res = run(["train", "--micro-shards", "3"], run_dir=self.path("single"))
        self.assertEqual(res.code, EXIT_USAGE)
        self.assertIn("culprit: error: option '--micro-shards' must be a power of two", res.err)
        res = run(["frobnicate"])
        self.assertEqual(res.code, EXIT_USAGE)
        self.assertIn("unknown command 'frobnicate'", res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
