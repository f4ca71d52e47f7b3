"""Damaged checkpoints: bytes flipped and files truncated at many offsets. verify, inspect, diff and
resume report the damage clearly and never crash. CULPRIT_BIN may point at an AddressSanitizer build."""
import os
import shutil
import sys
import unittest

import h5py

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, metrics, run  # noqa: E402

# More offsets for a thorough run: CULPRIT_CORRUPTION_OFFSETS=200.
N = int(os.environ.get("CULPRIT_CORRUPTION_OFFSETS", "24"))
ARGS = ["--steps", "10", "--global-batch", "32", "--micro-shards", "4", "--checkpoint-every", "5", "--trace", "off"]
CRASH_MARKERS = ("AddressSanitizer", "runtime error", "Segmentation", "terminate called", "Aborted", "core dumped")


def ckpt(run_dir, step):
    return os.path.join(run_dir, "checkpoints", "step-%08d.h5" % step)


class Corruption(TempDirTest):
    def setUp(self):
        super().setUp()
        self.clean = self.path("clean")
        self.train("clean", ARGS)
        self.file = ckpt(self.clean, 10)
        with open(self.file, "rb") as f:
            self.blob = f.read()
        with h5py.File(self.file, "r") as f:
            ds = f["model"]["fc1.weight"]
            self.data_off, self.data_len = ds.id.get_offset(), ds.id.get_storage_size()

    def damaged(self, name, blob):
        path = self.path(name + ".h5")
        with open(path, "wb") as f:
            f.write(blob)
        return path

    def no_crash(self, res, allowed):
        self.assertIn(res.code, allowed, res.out + res.err)
        for m in CRASH_MARKERS:
            self.assertNotIn(m, res.err)

    def test_flipped_bytes(self):
        size = len(self.blob)
        offsets = sorted(set([int(size * i / N) for i in range(N)] +
                             [self.data_off + k * self.data_len // 6 for k in range(6)]))
        detected = 0
        for n, off in enumerate(offsets):
            blob = bytearray(self.blob)
            blob[off] ^= 0xFF
            path = self.damaged("flip-%d" % off, bytes(blob))
            v = run(["verify", path], timeout=60)
            self.no_crash(v, (0, 4))
            if v.code == 4:
                detected += 1
                line = [l for l in (v.out + v.err).splitlines() if "FAIL" in l or "error" in l]
                self.assertTrue(line, v.out + v.err)
            if self.data_off <= off < self.data_off + self.data_len:
                self.assertEqual(v.code, 4, "a flip in /model/fc1.weight's data at %d went unnoticed" % off)
                self.assertIn("dataset '/model/fc1.weight': fingerprint mismatch: stored", v.out)
            if n % 3 == 0:
                self.no_crash(run(["inspect", path], timeout=60), (0, 4))
                self.no_crash(run(["diff", self.file, path], timeout=60), (0, 4, 5))
        # Flips in unused padding may be harmless; most bytes of the file matter.
        self.assertGreater(detected, len(offsets) // 2)

    def test_truncated_files(self):
        size = len(self.blob)
        for i in range(N // 2):
            cut = int(size * i / (N // 2))
            path = self.damaged("cut-%d" % cut, self.blob[:cut])
            v = run(["verify", path], timeout=60)
            self.no_crash(v, (4,))
            self.assertIn(path, v.out + v.err)
            if i % 3 == 0:
                self.no_crash(run(["inspect", path], timeout=60), (4,))

    def test_resume_skips_damaged_newest_checkpoint(self):
        reference = self.path("ref")
        self.train("ref", ARGS[:1] + ["15"] + ARGS[2:])
        # Stop the clean run after 10 steps, damage step 10, resume to 15.
        broken = self.path("broken")
        shutil.copytree(self.clean, broken)
        with open(ckpt(broken, 10), "r+b") as f:
            f.seek(self.data_off + 100)
            b = f.read(1)
            f.seek(self.data_off + 100)
            f.write(bytes([b[0] ^ 0x01]))
        r = run(["train", "--quiet", "--resume", "--steps", "15"], world=2, run_dir=broken)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("warning: skipping damaged checkpoint: checkpoint '%s' dataset '/model/fc1.weight': "
                      "fingerprint mismatch: stored" % ckpt(broken, 10), r.err)
        want = [m["fingerprint"] for m in metrics(reference)]
        got = [m["fingerprint"] for m in metrics(broken)]
        self.assertEqual(got, want)
        # --resume-from a damaged file is an error, not a fallback.
        shutil.copy(ckpt(broken, 5), self.path("five.h5"))
        with open(self.path("five.h5"), "r+b") as f:
            f.truncate(len(self.blob) // 3)
        r = run(["train", "--resume-from", self.path("five.h5"), "--steps", "15"], world=2, run_dir=broken)
        self.assertEqual(r.code, 4)  # damaged
        self.assertIn("five.h5", r.err)




if __name__ == "__main__":
    unittest.main(verbosity=2)
