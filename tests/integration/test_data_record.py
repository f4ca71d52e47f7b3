"""The data record (docs/data.md, "The data record"), under real mpirun: `culprit prepare-data`
and `culprit verify-data` on token and HDF5 files (contiguous and chunked), each damaged block named
with the file offsets and samples that hold the byte flipped (the truth injected, found independently
with numpy and h5py), and a record standing for the scan at open. Helpers and the corpus: culprit_testlib.py."""
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from culprit_testlib import (CORPUS_T, CULPRIT, DEFAULT_SEED as SEED, EXIT_DAMAGED, EXIT_USAGE, TIMEOUT,  # noqa: E402
                             DataTest, flip_byte, keep_mtime, make_corpus, metric_steps, randperm, remove_corpus, run,
                             tokens_of, write_tokens)

CORPUS = None  # scripts/tokenize.py's corpus, made once for the module


def setUpModule():
    global CORPUS
    CORPUS = make_corpus()


def tearDownModule():
    remove_corpus(CORPUS)


DAMAGED = re.compile(r"^damaged: block (\d+), file offset (\d+)\.\.(\d+): .*: (.*)$")


def sample_runs(text):
    """'samples 3..7, 12' -> [(3, 7), (12, 12)]."""
    out = []
    m = re.search(r"samples ([0-9., ]+)", text)
    for part in m.group(1).split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("..")
        out.append((int(a), int(b or a)))
    return out


class DataRecord(DataTest):
    BLOCK = 4096

    def prepare(self, data, extra=(), cwd=None, block=BLOCK):
        res = subprocess.run([CULPRIT, "prepare-data", "--data", data, "--block-bytes", str(block)] + list(extra),
                             capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)
        self.assertEqual(res.returncode, 0, res.stderr)
        return res

    def verify(self, data, extra=()):
        return run(["verify-data", "--data", data] + list(extra))

    def damaged_lines(self, res):
        self.assertEqual(res.code, EXIT_DAMAGED, res.out + res.err)
        lines = [DAMAGED.match(l) for l in res.out.splitlines() if l.startswith("damaged:")]
        self.assertTrue(all(lines), res.out)
        return lines

    def test_hdf5_contiguous_and_chunked(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((400, 24)).astype(np.float32)
        y = rng.integers(0, 5, 400)
        cases = {"contiguous": {}, "chunked": {"chunks": (16, 24), "compression": "gzip"}}
        for name, kw in cases.items():
            path = self.path(name + ".h5")
            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=x, **kw)
                f["y"] = y
            with self.subTest(layout=name):
                self.prepare("hdf5:" + path)
                self.assertTrue(os.path.exists(path + ".culprit.json"))
                clean = self.verify("hdf5:" + path)
                self.assertEqual(clean.code, 0, clean.out + clean.err)
                self.assertIn("blocks match the record", clean.out)
                row = 237
                with h5py.File(path, "r") as f:
                    d = f["x"]
                    if d.chunks is None:
                        offset = d.id.get_offset() + row * 24 * 4 + 5   # inside row 237's bytes
                        rows = (row, row)
                    else:
                        info = next(d.id.get_chunk_info(i) for i in range(d.id.get_num_chunks())
                                    if d.id.get_chunk_info(i).chunk_offset[0] <= row <
                                    d.id.get_chunk_info(i).chunk_offset[0] + 16)
                        offset = info.byte_offset + info.size // 2     # inside the chunk holding row 237
                        rows = (info.chunk_offset[0], info.chunk_offset[0] + 15)
                flip_byte(path, offset)
                lines = self.damaged_lines(self.verify("hdf5:" + path))
                self.assertEqual(len(lines), 1, [l.group(0) for l in lines])
                block, lo, hi = (int(v) for v in lines[0].groups()[:3])
                self.assertEqual((block, lo), (offset // self.BLOCK, offset // self.BLOCK * self.BLOCK))
                self.assertTrue(lo <= offset < hi, (lo, offset, hi))
                runs = sample_runs(lines[0].group(4))
                self.assertTrue(any(a <= rows[0] and rows[1] <= b for a, b in runs), (rows, runs))
        none = self.verify("hdf5:" + self.path("nothing.h5"))
        self.assertEqual(none.code, EXIT_USAGE, none.err)

    def test_token_files(self):
        # scripts/tokenize.py's corpus (its sidecar says dtype, vocab and seq_len 64), and a file that
        # has no sidecar (the options say it; verify-data's --seq-len names the samples).
        bare = self.path("t.bin")
        write_tokens(bare, np.random.default_rng(8).integers(0, 500, 30000 + 1))
        corpus = self.path("corpus.bin")
        shutil.copyfile(CORPUS, corpus)
        shutil.copyfile(CORPUS + ".json", corpus + ".json")
        cases = (("corpus", corpus, CORPUS_T, [], []),
                 ("bare", bare, 16, ["--token-dtype", "uint16", "--vocab", "500"], ["--token-dtype", "uint16", "--seq-len", "16"]))
        for name, path, T, prepare_opts, verify_opts in cases:
            with self.subTest(file=name):
                self.prepare("tokens:" + path, prepare_opts)
                clean = self.verify("tokens:" + path, verify_opts)
                self.assertEqual(clean.code, 0, clean.out + clean.err)
                self.assertIn("blocks match the record", clean.out)
                sample, pos = 1234 if name == "bare" else 1000, 7
                token = sample * T + pos
                offset = token * 2  # the low byte of token 7 of the window
                flip_byte(path, offset)
                lines = self.damaged_lines(self.verify("tokens:" + path, verify_opts))
                self.assertEqual(len(lines), 1, [l.group(0) for l in lines])
                block, lo, hi = (int(v) for v in lines[0].groups()[:3])
                self.assertEqual((block, lo), (offset // self.BLOCK, offset // self.BLOCK * self.BLOCK))
                self.assertTrue(lo <= offset < hi)
                self.assertEqual(hi, min(lo + self.BLOCK, os.path.getsize(path)))
                # The samples named are the windows of T tokens that hold the block's tokens: the
                # damaged window among them, and no window outside the block.
                runs = sample_runs(lines[0].group(4))
                self.assertEqual(len(runs), 1, lines[0].group(0))
                first, last = runs[0]
                self.assertTrue(first <= sample <= last, (sample, runs))
                self.assertEqual(first, max(0, (lo // 2 - 1) // T) if lo else 0)
                self.assertEqual(last, min((len(tokens_of(path, "uint16")) - 1) // T - 1, (hi // 2 - 1) // T))
                self.assertIn("tokens %d..%d" % (lo // 2, hi // 2 - 1), lines[0].group(4))
        # Without a window length, verify-data names the block's tokens.
        flat = self.verify("tokens:" + bare, ["--token-dtype", "uint16"])
        lines = self.damaged_lines(flat)
        self.assertNotIn("samples", lines[0].group(4))
        lo, hi = int(lines[0].group(2)), int(lines[0].group(3))
        self.assertEqual(lines[0].group(4), "tokens %d..%d" % (lo // 2, hi // 2 - 1))

    def test_prepare_data_of_a_large_token_file(self):
        # 64 MiB of tokens: prepare-data reads them in windows of one token. It took 45 s here when
        # every window's pages were released with a syscall of their own (100 MB: 73 s); about 0.5 s
        # once a call's windows are released together. The bound leaves room for a slow machine.
        path = self.path("big.bin")
        np.random.default_rng(1).integers(0, 50000, 32 << 20, dtype=np.uint16).astype("<u2").tofile(path)
        t0 = time.monotonic()
        res = self.prepare("tokens:" + path, ["--token-dtype", "uint16"], block=4 << 20)
        seconds = time.monotonic() - t0
        self.assertIn("%d tokens, %d bytes in 16 blocks of 4194304" % (32 << 20, 64 << 20), res.stdout)
        self.assertLess(seconds, 15.0, res.stdout)

    def test_a_record_stands_for_the_scan(self):
        # 40 windows of 16 tokens, batch 8: step 3 reads positions 16..23 of epoch 0's order.
        T, N, B = 16, 40, 8
        path = self.path("t.bin")
        tokens = np.random.default_rng(10).integers(0, 64, T * N + 1)
        write_tokens(path, tokens)
        opts = ["--token-dtype", "uint16", "--vocab", "64"]
        # The record is made with a relative path (from the file's directory) and read by a run given
        # the absolute one: it is the record beside the file either way.
        self.prepare("tokens:t.bin", opts, cwd=self.tmp)
        # After prepare-data, a token past the vocabulary in a window that step 3 reads, the file's
        # modification time kept: the record still vouches for the file, so the run does not scan it
        # at open; the check of every read finds it when step 3 reads that window.
        sample = randperm(SEED, 0, N)[2 * B + 3]
        bad = tokens.copy()
        bad[sample * T + 5] = 100
        keep_mtime(path, lambda p: write_tokens(p, bad))
        args = ["train", "--quiet", "--model", "gpt", "--data", "tokens:" + path, "--seq-len", str(T), "--global-batch",
                str(B), "--micro-shards", "4", "--steps", "5", "--checkpoint-every", "1"] + opts
        self.assert_refused(args + ["--run-dir", self.path("read")], EXIT_USAGE,
                            "token id 100 at sample %d (position 5 " % sample)
        self.assertIn(metric_steps(self.path("read")), ([1, 2], [1, 2, 3]))  # steps 1 and 2 trained; none after 3
        self.assertEqual(sorted(os.listdir(self.path("read", "checkpoints")))[-1], "step-00000002.h5")
        # A record of another size is not this file's: the scan at open runs and finds the token
        # before any step.
        record = path + ".culprit.json"
        with open(record) as f:
            r = json.load(f)
        r["file_bytes"] += 2
        with open(record, "w") as f:
            json.dump(r, f)
        self.assert_refused(args + ["--run-dir", self.path("open")], EXIT_USAGE,
                            "token id 100 at sample %d (position 5 " % sample)
        self.assertFalse(os.path.exists(self.path("open", "metrics.jsonl")) and
                         os.path.getsize(self.path("open", "metrics.jsonl")) > 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
