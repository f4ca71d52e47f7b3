"""A damaged data file (docs/data.md, "The data record") under real mpirun, scored against the
injected truth: the bytes of one sample of a token file, or of one HDF5 chunk, are changed after
`culprit prepare-data` recorded the file; the run trains on them without a detector noticing, and
`culprit bisect` calls it `data`, naming that sample, its file and offset, and nobody to exclude;
`culprit verify-data` names the block. A file changed after the run read it is `data` too (its
replay loads the sample unlike the record). The clean twin bisects to none (negative control)."""
import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CULPRIT, EXIT_DAMAGED, EXIT_IO, MPIRUN, TempDirTest, error_lines, run  # noqa: E402

SEED, B, M, STEPS = 7, 8, 4, 6
T, VOCAB, N = 256, 64, 600  # 512 bytes a window of uint16: a 512-byte record block holds one sample


def order(n, seed=SEED, epoch=0):
    """The epoch's sample order (docs/determinism.md, "1. Data order", randperm)."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def pick(n, before):
    """A sample of step 3 whose neighbour below is not read in the run (it shares one token with it)."""
    o = order(n)
    used = set(o[:STEPS * B])
    for i in o[2 * B:3 * B]:
        if i - 1 not in used and i > 0:
            return i
    raise AssertionError("no sample to damage")


class DataFaults(TempDirTest):
    def trained(self, name, args):
        """A run of the shape above on two ranks: its run directory."""
        return self.train(name, ["--seed", str(SEED), "--global-batch", str(B), "--micro-shards", str(M),
                                 "--steps", str(STEPS), "--checkpoint-every", "3", "--on-detect", "warn"] + args, 2).run_dir

    def tokens(self, name):
        rng = np.random.default_rng(1)
        path = self.path(name)
        rng.integers(0, VOCAB, N * T + 1, dtype=np.uint16).tofile(path)
        with open(path + ".json", "w") as f:
            json.dump({"dtype": "uint16", "vocab": VOCAB, "seq_len": T}, f)
        res = run(["prepare-data", "--data", "tokens:" + path, "--block-bytes", "512"])
        self.assertEqual(res.code, 0, res.err)
        return path

    def damage(self, path, offset, data):
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(data)

    def test_a_damaged_token_window_is_data_naming_the_sample(self):
        gpt = ["--model", "gpt", "--width", "16", "--heads", "2", "--layers", "1", "--optimizer", "adamw", "--lr", "0.003"]
        clean = self.tokens("clean.bin")
        bad = self.path("bad.bin")
        shutil.copy(clean, bad)
        shutil.copy(clean + ".json", bad + ".json")
        self.assertEqual(run(["prepare-data", "--data", "tokens:" + bad, "--block-bytes", "512"]).code, 0)
        i = pick(N, 3)
        first = i * T * 2  # window i's first byte
        self.damage(bad, first + 20, np.full(50, 3, dtype=np.uint16).tobytes())  # tokens inside window i
        # verify-data names the changed block and a sample range that holds window i.
        res = run(["verify-data", "--data", "tokens:" + bad])
        self.assertEqual(res.code, EXIT_DAMAGED, res.out + res.err)
        self.assertIn("file offset %d..%d" % (first, first + 512), res.out)
        self.assertEqual(run(["verify-data", "--data", "tokens:" + clean]).code, 0)
        d = self.trained("bad", gpt + ["--data", "tokens:" + bad])
        got = self.bisect(d, 2, "data")
        self.assertEqual((got["step"], got["sample"], got["sample_file"], got["sample_offset"], got["rank"]),
                         (3, i, bad, first, -1), got)
        self.assertEqual(got["phase"], "data")
        # Negative control: the same run on the file as prepared finds nothing.
        twin = self.trained("clean", gpt + ["--data", "tokens:" + clean])
        self.assertEqual(self.bisect(twin, 2, "none")["verdict"], "none")

    def test_a_damaged_hdf5_chunk_is_data_naming_its_sample_and_offset(self):
        rng = np.random.default_rng(2)
        x = rng.standard_normal((N, 32)).astype(np.float32)
        y = rng.integers(0, 10, N)
        path = self.path("chunked.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=x, chunks=(1, 32))  # one sample a chunk
            f.create_dataset("y", data=y, chunks=(64,))
        self.assertEqual(run(["prepare-data", "--data", "hdf5:" + path, "--block-bytes", "512"]).code, 0)
        i = pick(N, 3)
        with h5py.File(path, "r") as f:
            info = f["x"].id.get_chunk_info_by_coord((i, 0))
        self.damage(path, info.byte_offset + 8, np.full(4, 1e3, dtype=np.float32).tobytes())
        d = self.trained("h5", ["--model", "mlp", "--data", "hdf5:" + path])
        got = self.bisect(d, 2, "data")
        self.assertEqual((got["step"], got["sample"], got["sample_file"], got["sample_offset"], got["rank"]),
                         (3, i, path, info.byte_offset, -1), got)

    def test_a_record_of_another_file_is_not_compared(self):
        # The corpus made again (another size) after prepare-data: a clean run of it bisects to
        # none, saying the record was not compared (negative control of a stale record).
        gpt = ["--model", "gpt", "--width", "16", "--heads", "2", "--layers", "1"]
        path = self.tokens("remade.bin")
        np.random.default_rng(3).integers(0, VOCAB, (N + 10) * T + 1, dtype=np.uint16).tofile(path)
        d = self.trained("remade", gpt + ["--data", "tokens:" + path])
        got = self.bisect(d, 2, "none")
        self.assertIn("not compared (run culprit prepare-data again)", " ".join(got["evidence"]))

    def test_a_token_file_truncated_under_the_run_is_one_line(self):
        # Rank 0 stalls 4 s in step 3 (a hang fault); meanwhile the file is cut short. The read of a
        # later step sees it (a mapped page past the end would kill the rank with SIGBUS, which reads
        # as a silent rank: hardware): exit 6 on every rank, one line naming the file.
        path = self.tokens("cut.bin")
        run_dir = self.path("cut")
        cmd = MPIRUN + ["-np", "2", CULPRIT, "train", "--quiet", "--run-dir", run_dir, "--seed", str(SEED),
                        "--global-batch", str(B), "--micro-shards", str(M), "--steps", "8", "--model", "gpt",
                        "--width", "16", "--heads", "2", "--layers", "1", "--data", "tokens:" + path,
                        "--inject", "step=3,rank=0,phase=forward,layer=head,kind=hang,seconds=4"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        metrics = os.path.join(run_dir, "metrics.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline and not (os.path.exists(metrics) and open(metrics).read().count("\n") >= 2):
            time.sleep(0.05)
        os.truncate(path, T * 2 * 10)  # ten windows' bytes remain
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, EXIT_IO, out + err)
        lines = error_lines(err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn("data 'tokens:%s' shrank to %d bytes" % (path, T * 20), lines[0])
        self.assertNotIn("SIGBUS", err)
        self.assertNotIn("Bus error", err)

    def test_a_file_changed_after_the_run_read_it_is_data(self):
        gpt = ["--model", "gpt", "--width", "16", "--heads", "2", "--layers", "1"]
        path = self.tokens("late.bin")
        d = self.trained("late", gpt + ["--data", "tokens:" + path])
        i = order(N)[2 * B + 1]  # a sample of step 3
        self.damage(path, i * T * 2 + 40, np.full(8, 5, dtype=np.uint16).tobytes())
        got = self.bisect(d, 2, "data")
        self.assertEqual((got["step"], got["sample"], got["sample_file"], got["sample_offset"]),
                         (3, i, path, i * T * 2), got)


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
