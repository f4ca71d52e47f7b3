"""Training data at real scale (docs/data.md), under real mpirun: token files (`--data tokens:PATH`)
against an independent numpy reader of the window contract and PyTorch, the feistel order, streamed
HDF5 (chunked, compressed), the data record (`prepare-data` / `verify-data`) and the read stall."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from culprit_testlib import (CORPUS_T, CORPUS_V, CULPRIT, DEFAULT_SEED as SEED, EXIT_USAGE, MPIRUN, PY,  # noqa: E402
                             DataTest, make_corpus, make_scripted_model, randperm, remove_corpus, run, tokens_of,
                             write_tokens)
from feistel import FeistelOrder  # noqa: E402
from reference_trainer import fingerprint_bytes  # noqa: E402

# scripts/tokenize.py's corpus (culprit_testlib.make_corpus): made once for the module.
CORPUS = None
GPT = ["--model", "gpt", "--optimizer", "adamw", "--lr", "0.003", "--global-batch", "16", "--micro-shards", "4"]


def setUpModule():
    global CORPUS
    CORPUS = make_corpus()


def tearDownModule():
    remove_corpus(CORPUS)


# ---- the window contract, read independently of culprit ----

def windows(tokens, t):
    """Sample i of a token file: x = tokens [i*T, i*T + T), y = tokens [i*T + 1, i*T + T + 1)."""
    n = (len(tokens) - 1) // t
    x = np.stack([tokens[i * t: i * t + t] for i in range(n)])
    y = np.stack([tokens[i * t + 1: i * t + t + 1] for i in range(n)])
    return x, y


def comparable(res):
    """What must be bitwise equal between two runs: step, loss (float32 bits), grad_norm, fingerprint."""
    return [(m["step"], np.float32(m["loss"]).tobytes(), m["grad_norm"], m["fingerprint"]) for m in res.metrics()]


def step_one_sample_fps(run_dir):
    """{micro-shard: [fingerprint of each sample's input row]} of step 1, from every rank's trace."""
    out = {}
    trace = os.path.join(run_dir, "trace")
    for name in sorted(os.listdir(trace)):
        with h5py.File(os.path.join(trace, name), "r") as f:
            n = int(f.attrs["shards_committed"])
            steps, shards, fps = f["shards/step"][:n], f["shards/shard"][:n], f["shards/sample_fp"][:n]
            for s, k, row in zip(steps, shards, fps):
                if s == 1:
                    out[int(k)] = [int(v) for v in row]
    return out


def mapped_kb(pid, path):
    """The resident KiB of pid's mappings of path (/proc/PID/smaps), None before it maps it."""
    total, inside, found = 0, False, False
    real = os.path.realpath(path)
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            head = line.split()
            if head and re.match(r"^[0-9a-f]+-[0-9a-f]+$", head[0]):
                inside = len(head) >= 6 and head[5] == real
                found = found or inside
            elif inside and head and head[0] == "Rss:":
                total += int(head[1])
    return total if found else None


def order_first(n, b):
    """The first sample step 1 reads (randperm order, default seed)."""
    return randperm(SEED, 0, n)[0]


class TokenData(DataTest):
    def test_gpt_on_the_corpus_is_bitwise_equal_at_world_sizes(self):
        ref = None
        for world in (1, 2, 4):
            res = self.train("w%d" % world, GPT + ["--data", "tokens:" + CORPUS, "--steps", "6"], world=world)
            rows = comparable(res)
            self.assertEqual(len(rows), 6)
            if ref is None:
                ref = rows
                self.assertLess(res.metrics()[-1]["loss"], res.metrics()[0]["loss"])  # it learns
            else:
                self.assertEqual(rows, ref, "W=%d differs from W=1" % world)
        # Negative control: one token of a window that step 1 reads, changed: step 1 differs.
        tokens = tokens_of(CORPUS, "uint16")
        sample = randperm(SEED, 0, (len(tokens) - 1) // CORPUS_T)[0]
        tokens[sample * CORPUS_T + 5] = (tokens[sample * CORPUS_T + 5] + 1) % CORPUS_V
        other = self.path("other.bin")
        write_tokens(other, tokens, meta={"dtype": "uint16", "vocab": CORPUS_V, "seq_len": CORPUS_T})
        res = self.train("changed", GPT + ["--data", "tokens:" + other, "--steps", "1"], world=2)
        self.assertNotEqual(comparable(res)[0], ref[0])

    def test_window_contract_against_numpy_and_pytorch(self):
        tokens = tokens_of(CORPUS, "uint16")
        x, y = windows(tokens, CORPUS_T)
        self.assertEqual(len(x), (len(tokens) - 1) // CORPUS_T)
        h5 = self.path("windows.h5")
        with h5py.File(h5, "w") as f:
            f["x"], f["y"] = x, y
        steps = ["--steps", "4"]
        # The token file and the same windows stored as HDF5 (another reader): the same bits.
        tok = self.train("tokens", GPT + steps + ["--data", "tokens:" + CORPUS], world=2)
        hdf = self.train("hdf5", GPT + steps + ["--data", "hdf5:" + h5, "--vocab", str(CORPUS_V)], world=1)
        self.assertEqual(comparable(tok), comparable(hdf))
        # What culprit read for step 1, sample by sample (the trace's sample fingerprints): the numpy
        # windows of the samples randperm puts there.
        order = randperm(SEED, 0, len(x))
        per = 16 // 4
        got = step_one_sample_fps(tok.run_dir)
        self.assertEqual(sorted(got), [0, 1, 2, 3])
        for k, fps in got.items():
            want = [fingerprint_bytes(x[i].astype("<i8").tobytes()) for i in order[k * per:(k + 1) * per]]
            self.assertEqual(fps, want, "micro-shard %d" % k)
        # A TorchScript model ([B, T] ids -> [B, T, V] logits) on the token file, against PyTorch eager
        # (reference_trainer.py) on the numpy windows.
        model = self.path("lm.pt")
        make_scripted_model(model, "token_lm")
        args = ["--optimizer", "adamw", "--lr", "0.01", "--global-batch", "16", "--micro-shards", "4", "--steps", "4"]
        ts = self.train("ts", ["--model", "torchscript:" + model, "--data", "tokens:" + CORPUS] + args, world=2)
        out = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--model", model, "--data", h5] + args,
                             capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stderr)
        ref = [json.loads(line) for line in out.stdout.splitlines()]
        self.assertEqual([(m["step"], np.float32(m["loss"]).tobytes(), m["fingerprint"]) for m in ts.metrics()],
                         [(r["step"], np.float32(r["loss"]).tobytes(), r["fingerprint"]) for r in ref])

    def test_uint32_tokens(self):
        # The corpus as uint32: the same samples, the same bits as the uint16 file.
        tokens = tokens_of(CORPUS, "uint16")
        wide = self.path("wide.bin")
        write_tokens(wide, tokens, "uint32", {"dtype": "uint32", "vocab": CORPUS_V, "seq_len": CORPUS_T})
        self.assertEqual(os.path.getsize(wide), 4 * len(tokens))
        a = self.train("u16", GPT + ["--steps", "3", "--data", "tokens:" + CORPUS], world=2)
        b = self.train("u32", GPT + ["--steps", "3", "--data", "tokens:" + wide], world=2)
        self.assertEqual(comparable(a), comparable(b))
        # Ids past 16 bits are read whole: 70000 (0x11170; 0x1170 as a 16-bit id) is past --vocab 70000.
        big = self.path("big.bin")
        t = np.random.default_rng(4).integers(0, 70000, 16 * 20 + 1)
        t[16 * 3 + 2] = 70000
        write_tokens(big, t, "uint32")
        self.assert_refused(["train", "--quiet", "--run-dir", self.path("big"), "--model", "gpt", "--data",
                             "tokens:" + big, "--token-dtype", "uint32", "--vocab", "70000", "--seq-len", "16",
                             "--global-batch", "8", "--micro-shards", "2"], EXIT_USAGE,
                            "token id 70000 at sample 3 (position 2 ", "offset %d," % (4 * (16 * 3 + 2)))

    def test_read_pages_leave_the_process(self):
        # A 32 MiB token file in the page cache: a read fault also maps the cached neighbours of the
        # page it needs (the kernel's fault-around, 64 KiB), here in the large folios that
        # prepare-data's read-ahead left (the file written back and evicted first). What a rank
        # keeps mapped of the file while it trains (its Rss in /proc/PID/smaps) must stay at about
        # the windows it is reading, not grow with the windows it has read: it reached 18 MiB in
        # these 60 steps while only each window's own pages were released. The record also stands
        # for the scan at open, whose 4 MiB of windows at a time would blur the peak.
        path = self.path("cached.bin")
        write_tokens(path, np.random.default_rng(5).integers(0, 512, 16 << 20),
                     meta={"dtype": "uint16", "vocab": 512, "seq_len": 64})
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        res = run(["prepare-data", "--data", "tokens:" + path])
        self.assertEqual(res.code, 0, res.err)
        pids = self.path("pids")
        os.makedirs(pids)
        script = self.path("rank.sh")
        with open(script, "w") as f:
            f.write('#!/bin/sh\necho $$ > "%s/$OMPI_COMM_WORLD_RANK"\nexec "$@"\n' % pids)
        os.chmod(script, 0o755)
        cmd = MPIRUN + ["-np", "2", script, CULPRIT, "train", "--quiet", "--run-dir", self.path("run"), "--data",
                        "tokens:" + path] + GPT + ["--steps", "400", "--trace", "off"]  # long enough to sample
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak, seen = {}, {}
        while proc.poll() is None:
            for r in ("0", "1"):
                try:
                    with open(os.path.join(pids, r)) as f:
                        pid = int(f.read())
                    kb = mapped_kb(pid, path)
                except (OSError, ValueError):
                    continue
                if kb is not None:
                    peak[r] = max(peak.get(r, 0), kb)
                    seen[r] = seen.get(r, 0) + 1
            time.sleep(0.02)
        out, err = proc.communicate()
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(sorted(seen), ["0", "1"], "no samples of the ranks' mappings")
        self.assertGreater(min(seen.values()), 20, seen)
        for r, kb in peak.items():
            self.assertLessEqual(kb, 512, "rank %s kept %d KiB of the data file mapped" % (r, kb))

    def test_width_without_a_vocabulary_with_and_without_a_record(self):
        # No vocabulary given: gpt's width is the largest token + 1. The file's largest token (60) is
        # in its tail, after the last window; the windows' tokens are below 50. A data record (which
        # reads every token) and the scan at open must agree on the width: the same bits either way
        # (the scan read 50 and the record 61 before the scan counted the tail).
        T = 16
        t = np.random.default_rng(14).integers(0, 50, T * 20 + 1 + 5)
        t[-2] = 60
        path = self.path("tail.bin")
        write_tokens(path, t)
        args = ["--model", "gpt", "--data", "tokens:" + path, "--token-dtype", "uint16", "--seq-len", str(T),
                "--global-batch", "8", "--micro-shards", "2", "--steps", "2"]
        scanned = self.train("scanned", args, world=2)
        res = run(["prepare-data", "--data", "tokens:" + path, "--token-dtype", "uint16"])
        self.assertEqual(res.code, 0, res.err)
        self.assertIn("largest token 60", res.out)
        recorded = self.train("recorded", args, world=2)
        self.assertEqual(comparable(scanned), comparable(recorded))
        with_vocab = self.train("vocab61", args + ["--vocab", "61"], world=2)
        self.assertEqual(comparable(with_vocab), comparable(scanned))

    def test_sidecar_and_options(self):
        bare = self.path("bare.bin")
        shutil.copyfile(CORPUS, bare)  # no sidecar: the options say it all
        steps = GPT + ["--steps", "2"]
        with_sidecar = self.train("sidecar", steps + ["--data", "tokens:" + CORPUS])
        options = ["--token-dtype", "uint16", "--vocab", str(CORPUS_V), "--seq-len", str(CORPUS_T)]
        by_options = self.train("options", steps + ["--data", "tokens:" + bare] + options)
        both = self.train("both", steps + ["--data", "tokens:" + CORPUS] + options)
        self.assertEqual(comparable(by_options), comparable(with_sidecar))
        self.assertEqual(comparable(both), comparable(with_sidecar))
        # An option that disagrees with the sidecar: one line naming both values.
        for option, value, key, stored in (("--seq-len", "32", "seq_len", "64"), ("--vocab", "1024", "vocab", "512"),
                                           ("--token-dtype", "uint32", "dtype", "uint16")):
            with self.subTest(option=option):
                self.assert_refused(["train", "--quiet", "--run-dir", self.path("x" + key)] + steps +
                                    ["--data", "tokens:" + CORPUS, option, value], EXIT_USAGE,
                                    "option '%s' is %s" % (option, value), "says %s %s" % (key, stored))
        broken = self.path("broken.bin")
        shutil.copyfile(CORPUS, broken)
        with open(broken + ".json", "w") as f:
            f.write("{\"dtype\": \"uint16\", \"vocab\": \n")
        self.assert_refused(["train", "--quiet", "--run-dir", self.path("broken")] + steps +
                            ["--data", "tokens:" + broken], EXIT_USAGE, "token data sidecar '%s.json'" % broken)

    def test_bad_token_files(self):
        data = self.path("data")
        os.makedirs(data)
        rng = np.random.default_rng(9)
        t = rng.integers(0, 64, 16 * 30 + 1)
        write_tokens(os.path.join(data, "good.bin"), t)
        opts = ["--model", "gpt", "--token-dtype", "uint16", "--vocab", "64", "--seq-len", "16", "--global-batch", "8",
                "--micro-shards", "2", "--steps", "2"]
        with open(os.path.join(data, "odd.bin"), "wb") as f:
            f.write(t.astype("<u2").tobytes() + b"\x01")
        write_tokens(os.path.join(data, "short.bin"), t[:10])
        # Token 4 of window 12 (token 196 of the file, bytes 392..393) past the vocabulary: named by its
        # sample, its place in the window and its own file offset (it is also y[3] of that window).
        high = t.copy()
        high[12 * 16 + 4] = 64
        write_tokens(os.path.join(data, "high.bin"), high)
        # The window's last token (position 16: y[15]) is the next window's first (x[0]): the first
        # window holding it names it.
        last = t.copy()
        last[7 * 16 + 16] = 65
        write_tokens(os.path.join(data, "last.bin"), last)
        cases = [
            (["--data", "tokens:" + os.path.join(data, "high.bin")] + opts,
             ["token id 64 at sample 12 (position 4 of its window of 17 tokens: x[4], y[3]); valid token ids are [0, 64)",
              "offset 392, token 196 of the file"]),
            (["--data", "tokens:" + os.path.join(data, "last.bin")] + opts,
             ["token id 65 at sample 7 (position 16 of its window of 17 tokens: y[15])", "offset 256, token 128 "]),
            (["--data", "tokens:" + os.path.join(data, "odd.bin")] + opts,
             ["its 963 bytes are not a whole number of uint16 token ids (2 bytes each)"]),
            (["--data", "tokens:" + os.path.join(data, "short.bin")] + opts,
             ["holds 10 tokens: too few for one sample of --seq-len 16 (17 tokens)"]),
            (["--data", "tokens:" + os.path.join(data, "good.bin")] + opts[:-6] + ["--global-batch", "32",
                                                                                  "--micro-shards", "2"],
             ["--global-batch 32 exceeds the 30 samples"]),
            (["--data", "tokens:" + os.path.join(data, "good.bin"), "--model", "gpt", "--vocab", "64", "--seq-len", "16"],
             ["the token dtype is not known: give --token-dtype uint16|uint32"]),
            (["--data", "token:" + os.path.join(data, "good.bin")] + opts[:2],
             ["unknown data source 'token:"]),
        ]
        for i, (args, needles) in enumerate(cases):
            with self.subTest(case=needles[0]):
                self.assert_refused(["train", "--quiet", "--run-dir", self.path("run%d" % i)] + args, EXIT_USAGE,
                                    *needles, watch=[data])


class Feistel(DataTest):
    # 40 windows of 16 tokens, batch 8: 5 steps an epoch; 12 steps cross two epoch boundaries.
    T, N, B = 16, 40, 8

    def setUp(self):
        super().setUp()
        self.tokens = np.random.default_rng(6).integers(0, 64, self.T * self.N + 1)
        self.data = self.path("s.bin")
        write_tokens(self.data, self.tokens, meta={"dtype": "uint16", "vocab": 64, "seq_len": self.T})
        self.args = ["--model", "gpt", "--data", "tokens:" + self.data, "--global-batch", str(self.B),
                     "--micro-shards", "4", "--optimizer", "adamw", "--lr", "0.003"]

    def test_feistel_order_world_sizes_randperm_and_resume(self):
        feistel = self.args + ["--shuffle", "feistel", "--steps", "12"]
        ref = None
        for world in (1, 2, 4):
            rows = comparable(self.train("f%d" % world, feistel, world=world))
            self.assertEqual(len(rows), 12)
            if ref is None:
                ref = rows
            else:
                self.assertEqual(rows, ref, "W=%d differs from W=1" % world)
        # Step 1 read the windows that the order of docs/determinism.md (feistel.py) puts there.
        x, _ = windows(self.tokens, self.T)
        order = FeistelOrder(SEED, 0, self.N)
        got = step_one_sample_fps(self.path("f1"))
        per = self.B // 4
        for k, fps in got.items():
            want = [fingerprint_bytes(x[order.sample_at(p)].astype("<i8").tobytes()) for p in range(k * per, (k + 1) * per)]
            self.assertEqual(fps, want, "micro-shard %d" % k)
        # Negative control: the randperm order trains other bits.
        other = comparable(self.train("randperm", self.args + ["--steps", "12"], world=2))
        self.assertNotEqual(other[0], ref[0])
        # Stopped mid-epoch at W = 2 (step 7 of 12: epoch 1), resumed at W = 4: the uninterrupted run.
        self.train("resumed", feistel[:-1] + ["7", "--checkpoint-every", "7"], world=2)
        res = run(["train", "--quiet", "--resume", "--steps", "12"], world=4, run_dir=self.path("resumed"))
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(comparable(res), ref)


class Hdf5Streaming(DataTest):
    def test_chunked_and_compressed_train_as_contiguous(self):
        rng = np.random.default_rng(12)
        x = rng.standard_normal((96, 32)).astype(np.float32)
        y = rng.integers(0, 10, 96).astype(np.int64)
        layouts = {
            "contiguous": {},
            "chunked": {"chunks": True},       # h5py picks the chunk shape
            "rows7": {"chunks": (7, 32)},      # chunks that cut across every micro-shard
            "gzip": {"chunks": (5, 32), "compression": "gzip", "compression_opts": 6, "shuffle": True},
        }
        for name, kw in layouts.items():
            with h5py.File(self.path(name + ".h5"), "w") as f:
                f.create_dataset("x", data=x, **kw)
                ykw = dict({k: v for k, v in kw.items() if k != "chunks"}, chunks=True) if kw else {}
                f.create_dataset("y", data=y, **ykw)
        with h5py.File(self.path("gzip.h5"), "r") as f:
            self.assertEqual(f["x"].compression, "gzip")
            self.assertIsNone(h5py.File(self.path("contiguous.h5"), "r")["x"].chunks)
        args = ["--model", "mlp", "--steps", "8", "--global-batch", "16", "--micro-shards", "4"]
        ref = comparable(self.train("contiguous", args + ["--data", "hdf5:" + self.path("contiguous.h5")], world=1))
        for name, world in (("chunked", 2), ("rows7", 4), ("gzip", 2), ("gzip", 1)):
            with self.subTest(layout=name, world=world):
                res = self.train("%s-w%d" % (name, world), args + ["--data", "hdf5:" + self.path(name + ".h5")], world=world)
                self.assertEqual(comparable(res), ref)
        # Negative control: one value changed in the compressed file changes the run.
        x[order_first(96, 16)] += 0.25
        with h5py.File(self.path("gzip2.h5"), "w") as f:
            f.create_dataset("x", data=x, **layouts["gzip"])
            f["y"] = y
        res = self.train("gzip2", args + ["--data", "hdf5:" + self.path("gzip2.h5")], world=2)
        self.assertNotEqual(comparable(res)[0], ref[0])

    def test_a_bad_value_is_named_where_it_lies(self):
        # A NaN in row 21: named by its sample and element and where the row lies in the file — its
        # own bytes when contiguous, the chunk that holds it when chunked (filtered: the whole chunk).
        rng = np.random.default_rng(13)
        x = rng.standard_normal((64, 7)).astype(np.float32)
        x[21, 3] = np.nan
        y = rng.integers(0, 3, 64)
        for name, kw in (("contiguous", {}), ("chunked", {"chunks": (8, 7)}),
                         ("gzip", {"chunks": (8, 7), "compression": "gzip"})):
            path = self.path(name + ".h5")
            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=x, **kw)
                f["y"] = y
            with h5py.File(path, "r") as f:
                d = f["x"]
                if d.chunks is None:
                    where = "offset %d (dataset x row 21)" % (d.id.get_offset() + 21 * 7 * 4)
                else:
                    info = d.id.get_chunk_info_by_coord((16, 0))
                    where = "offset %d (dataset x row 21, in the %d-byte chunk stored there%s" % (
                        info.byte_offset, info.size, " (filtered" if name == "gzip" else ")")
            with self.subTest(layout=name):
                self.assert_refused(["train", "--quiet", "--run-dir", self.path("run-" + name), "--data",
                                     "hdf5:" + path, "--global-batch", "16", "--micro-shards", "2"], EXIT_USAGE,
                                    "x holds a non-finite value (nan) in sample 21 (element 3)", where)

    def test_a_bad_label_is_named_in_y(self):
        # A label out of range in row 5 of y: the place named is y's row — the dataset that holds the
        # bad value — at y's own offset, never x's row 5 (x is clean).
        rng = np.random.default_rng(14)
        x = rng.standard_normal((64, 7)).astype(np.float32)
        y = rng.integers(0, 3, 64)
        y[5] = 9
        for name, kw in (("contiguous", {}), ("chunked", {"chunks": (8,)})):
            path = self.path("label-%s.h5" % name)
            with h5py.File(path, "w") as f:
                f["x"] = x
                f.create_dataset("y", data=y, **kw)
            with h5py.File(path, "r") as f:
                d = f["y"]
                if d.chunks is None:
                    where = "offset %d (dataset y row 5)" % (d.id.get_offset() + 5 * 8)
                else:
                    info = d.id.get_chunk_info_by_coord((0,))
                    where = "offset %d (dataset y row 5, in the %d-byte chunk stored there)" % (info.byte_offset, info.size)
            with self.subTest(layout=name):
                line = self.assert_refused(["train", "--quiet", "--run-dir", self.path("run-label-" + name), "--data",
                                            "hdf5:" + path, "--classes", "3", "--global-batch", "16",
                                            "--micro-shards", "2"], EXIT_USAGE,
                                           "y holds class label 9 at sample 5; valid class labels are [0, 3)", where)
                self.assertNotIn("dataset x", line)

    def test_unwritten_chunks_are_refused(self):
        path = self.path("partial.h5")
        with h5py.File(path, "w") as f:
            d = f.create_dataset("x", shape=(64, 7), dtype="f4", chunks=(8, 7))
            d[:32] = np.ones((32, 7), np.float32)
            f["y"] = np.zeros(64, np.int64)
        self.assert_refused(["train", "--quiet", "--run-dir", self.path("run"), "--data", "hdf5:" + path,
                             "--global-batch", "16", "--micro-shards", "2"], EXIT_USAGE,
                            "dataset 'x' stores 4 of its 8 chunks")

if __name__ == "__main__":
    unittest.main(verbosity=2)
