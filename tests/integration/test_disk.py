"""Full, failing and read-only disks under a run directory (docs/architecture.md, "I/O failures"):
the job ends promptly on every rank with exit 6 naming the file and the OS's reason, without a
crash, nothing already written damaged, and the run resumes bitwise once there is room. Real
filesystems throughout: a tmpfs of a few hundred KiB for a full disk, ext4 on a loop device whose
backing tmpfs fills for a real EIO (mounting needs root, as in CI)."""
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (CULPRIT, EXIT_IO, MPIRUN, SMALL_MLP as ARGS, TempDirTest, metric_steps,  # noqa: E402
                             metric_steps_until_torn, run, run_each_rank_code, tree_digest)


def can_mount():
    return os.geteuid() == 0 and shutil.which("mount") is not None


@unittest.skipUnless(can_mount(), "a loop-mounted ext4 needs root (CI runs as root)")
class FailingDisk(TempDirTest):
    """A real EIO: ext4 on a loop device whose backing file lies on a small tmpfs. Once the tmpfs is
    full the loop device's writes fail, ext4 sees I/O errors, aborts its journal and turns itself
    read-only, while its free space still looks ample (no free-space check can see it coming)."""

    def setUp(self):
        super().setUp()
        self.back, self.disk = self.path("back"), self.path("disk")
        os.makedirs(self.back)
        os.makedirs(self.disk)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", self.back], check=True)
        image = os.path.join(self.back, "ext4.img")
        subprocess.run(["truncate", "-s", "64M", image], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
        self.loop = subprocess.run(["losetup", "-f", "--show", image], capture_output=True, text=True,
                                   check=True).stdout.strip()
        subprocess.run(["mount", "-o", "errors=remount-ro", self.loop, self.disk], check=True)

    def tearDown(self):
        subprocess.run(["umount", self.disk], check=False)
        subprocess.run(["losetup", "-d", self.loop], check=False)
        subprocess.run(["umount", self.back], check=False)
        super().tearDown()

    def test_a_failing_disk_ends_the_job_with_exit_6_and_no_crash(self):
        d = os.path.join(self.disk, "run")
        args = ["train", "--steps", "20000", "--checkpoint-every", "50", "--collective-timeout", "30"] + ARGS
        line = self.assert_refused(args + ["--run-dir", d], EXIT_IO, d)  # one line, naming the file
        self.assertTrue("Input/output error" in line or "Read-only file system" in line, line)
        self.assertLess(len(metric_steps_until_torn(d)), 20000)


@unittest.skipUnless(can_mount(), "a tmpfs for the full disk needs root (CI runs as root)")
class FullDisk(TempDirTest):
    def setUp(self):
        super().setUp()
        self.disk = self.path("disk")
        os.makedirs(self.disk)
        self.mount("size=700k")

    def tearDown(self):
        subprocess.run(["umount", self.disk], check=False)
        super().tearDown()

    def mount(self, opts):
        if os.path.ismount(self.disk):
            subprocess.run(["mount", "-o", "remount," + opts, self.disk], check=True)
        else:
            subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", self.disk], check=True)

    def fill(self):
        """Fills the tmpfs; returns a 4 KiB file whose removal frees one page."""
        spare = os.path.join(self.disk, "spare")
        with open(spare, "wb") as f:
            f.write(b"\0" * 4096)
        fd = os.open(os.path.join(self.disk, "fill"), os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096) > 0:
                pass
        except OSError:
            pass
        os.close(fd)
        return spare

    def test_a_full_disk_ends_the_job_with_exit_6_and_damages_nothing(self):
        args = ["--steps", "60", "--checkpoint-every", "5", "--keep-last", "100", "--collective-timeout", "30"] + ARGS
        ref = run(["train"] + args, world=2, run_dir=self.path("ref"))
        self.assertEqual(ref.code, 0, ref.err)
        d = os.path.join(self.disk, "run")
        t0 = time.time()
        r = run(["train"] + args, world=2, run_dir=d)
        took = time.time() - t0
        self.assertEqual(r.code, EXIT_IO, r.err)
        self.assertIn("No space left on device", r.err)
        self.assertIn(os.path.join(d, "checkpoints", "step-"), r.err)  # the file it could not write
        self.assertLess(took, 30, "it waited for the collective timeout instead of ending promptly")
        self.assertFalse([n for n in os.listdir(os.path.join(d, "checkpoints")) if n.endswith(".tmp")])
        v = run(["verify", d])
        self.assertEqual(v.code, 0, v.out + v.err)  # everything written before stays whole
        self.mount("size=8m")
        r = run(["train", "--resume"] + args, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(metric_steps(d), list(range(1, 61)))
        self.assertEqual(r.metrics()[-1]["fingerprint"], ref.final_fingerprint())

    def test_a_disk_filling_between_checkpoints_ends_the_job_at_once(self):
        # The trace and metrics.jsonl fill the disk long before the next checkpoint (step 1000): the
        # job ends within a few steps of it on every rank with exit 6 (HDF5 took the last trace
        # rows into its chunk cache and failed only when writing them out: that failure counts), no
        # committed trace row is lost, and the run resumes from step 0 bitwise.
        args = ["--checkpoint-every", "1000", "--collective-timeout", "30"] + ARGS
        d = os.path.join(self.disk, "run")
        codes, _, err = run_each_rank_code(["train", "--steps", "3000"] + args + ["--run-dir", d], 2, self.tmp)
        self.assertEqual(codes, [EXIT_IO, EXIT_IO], err)
        self.assertIn("No space left on device", err)
        steps = metric_steps_until_torn(d)
        for rank in range(2):  # the trace stopped where the metrics did, not at the checkpoint
            trace_steps = subprocess.run([sys.executable, "-c", "import h5py,sys; print(h5py.File(sys.argv[1], 'r')"
                                          ".attrs['steps_committed'])", os.path.join(d, "trace", "rank-%05d.h5" % rank)],
                                         capture_output=True, text=True, check=True).stdout
            self.assertLess(int(trace_steps), steps[-1] + 10, "the job ran on with a broken trace")
        v = run(["verify", d])
        self.assertEqual(v.code, 0, v.out + v.err)  # every committed row passes its checksum
        self.assertNotIn("FAIL", v.out)
        self.mount("size=64m")
        r = run(["train", "--resume", "--steps", "400"] + args, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        ref = run(["train", "--steps", "400"] + args, world=2, run_dir=self.path("ref"))
        self.assertEqual(r.metrics()[-1]["fingerprint"], ref.final_fingerprint())
        v = run(["verify", d])
        self.assertEqual(v.code, 0, v.out + v.err)

    def test_a_failed_start_leaves_no_empty_run_json(self):
        os.remove(self.fill())  # one page left: the lock takes it, run.json finds none
        d = os.path.join(self.disk, "run")
        r = run(["train", "--steps", "4"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, EXIT_IO, r.err)
        self.assertIn("No space left on device", r.err)
        self.assertFalse(os.path.lexists(os.path.join(d, "run.json")))
        self.assertFalse(os.path.lexists(os.path.join(d, "run.json.tmp")))
        # Nothing empty or half-made is left (the traces are created first; the lock file stays).
        left = {os.path.relpath(os.path.join(b, n), d) for b, _, ns in os.walk(d) for n in ns}
        self.assertEqual(left - {".lock"}, set(), left)

    def test_a_read_only_filesystem_is_an_io_error(self):
        d = os.path.join(self.disk, "run")
        r = run(["train", "--steps", "4", "--checkpoint-every", "2"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        before = tree_digest(d)
        self.mount("ro")
        for args in (["train", "--resume", "--steps", "6"] + ARGS, ["bisect"]):
            with self.subTest(args=args[0]):
                r = run(args, world=2, run_dir=d)
                self.assertEqual(r.code, EXIT_IO, r.err)
                self.assertIn("Read-only file system", r.err)
        self.mount("rw")
        self.assertEqual(tree_digest(d), before)


@unittest.skipUnless(can_mount(), "a read-only bind mount needs root (CI runs as root)")
class ReadOnlyArchive(TempDirTest):
    """A run archived read-only (here: a read-only bind mount of it; root ignores permission bits).
    The commands that only read a run work on it; bisect and audit, which write their report and
    lock into the run, refuse with one line saying to copy the run to a writable place (exit 6)."""

    def setUp(self):
        super().setUp()
        self.train("run", ["--steps", "4", "--checkpoint-every", "2"] + ARGS[:-1], world=2)
        self.archive = self.path("archive")
        os.makedirs(self.archive)
        subprocess.run(["mount", "--bind", self.path("run"), self.archive], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", self.archive], check=True)

    def tearDown(self):
        subprocess.run(["umount", self.archive], check=False)
        super().tearDown()

    def test_readers_work_and_writers_say_what_to_do(self):
        before = tree_digest(self.path("run"))
        v = run(["verify", self.archive])
        self.assertEqual(v.code, 0, v.out + v.err)
        r = run(["replay", "--step", "3", "--run-dir", self.archive], world=2)
        self.assertEqual(r.code, 0, r.out + r.err)
        for args in (["bisect"], ["audit"]):
            with self.subTest(args=args[0]):
                line = self.assert_refused(args + ["--run-dir", self.archive], EXIT_IO, "Read-only file system",
                                           "culprit %s writes into the run directory" % args[0],
                                           "copy the run to a writable place (cp -a '%s' COPY)" % self.archive)
                self.assertIn(os.path.join(self.archive, ".lock"), line)
        self.assertEqual(tree_digest(self.path("run")), before)
        # What the line says works: the copy bisects.
        shutil.copytree(self.archive, self.path("copy"), symlinks=True)
        b = run(["bisect", "--run-dir", self.path("copy")], world=2)
        self.assertEqual(b.code, 0, b.out + b.err)


class FileSizeLimit(TempDirTest):
    """`ulimit -f` (RLIMIT_FSIZE): a write past it raised SIGXFSZ and killed ranks without a word.
    culprit ignores the signal, so the write fails (EFBIG) and the job ends like a full disk: exit 6
    on every rank, one line naming the file."""

    def test_a_file_size_limit_ends_the_job_with_exit_6(self):
        d = self.path("run")
        limit = ["bash", "-c", 'ulimit -f 200 && exec "$@"', "limit", CULPRIT]  # 200 KiB, on every rank
        args = ["train", "--steps", "20000", "--checkpoint-every", "50", "--collective-timeout", "60",
                "--run-dir", d] + ARGS
        line = self.assert_refused(args, EXIT_IO, d, "File too large", program=limit)
        self.assertNotIn("File size limit exceeded", line)
        self.assertLess(len(metric_steps_until_torn(d)), 20000)
        # Nothing already written is damaged: the run verifies up to its newest checkpoint (the trace
        # stops before an append that could pass the limit: cut short, HDF5 could not open it again).
        v = run(["verify", d])
        self.assertEqual(v.code, 0, v.out + v.err)

    def test_the_whole_job_under_a_file_size_limit(self):
        # `ulimit -f 200; mpirun ...`: Open MPI's launcher is limited too, and its PMIx shared-memory
        # store (larger than that) fails before any rank starts unless PMIx keeps it in a hash
        # (docs/architecture.md, "I/O failures"); then culprit ends the job with exit 6 and one line.
        d = self.path("run")
        env = dict(os.environ, PMIX_MCA_gds="hash")
        cmd = (["bash", "-c", 'ulimit -f 200 && exec "$@"', "limit"] + MPIRUN +
               ["-np", "2", CULPRIT, "train", "--steps", "20000", "--checkpoint-every", "50", "--run-dir", d] + ARGS)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, EXIT_IO, r.stdout + r.stderr)
        lines = [l for l in r.stderr.splitlines() if l.startswith("culprit: error:")]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(d, lines[0])
        self.assertIn("File too large", lines[0])
        self.assertNotIn("signal 25", r.stderr)
        self.assertEqual(run(["verify", d]).code, 0)

    def test_a_checkpoint_over_the_limit_is_refused_before_its_first_byte(self):
        d = self.path("run")
        # Room for the records of the first steps, not for the initial checkpoint (~1.1 MB).
        limit = ["bash", "-c", 'ulimit -f 400 && exec "$@"', "limit", CULPRIT]
        args = ["train", "--steps", "4", "--checkpoint-every", "2", "--hidden", "512", "--run-dir", d] + ARGS
        self.assert_refused(args, EXIT_IO, "cannot write checkpoint", "the file size limit, ulimit -f, is 409600 bytes",
                            program=limit)
        self.assertEqual([n for n in os.listdir(os.path.join(d, "checkpoints")) if n.endswith(".tmp")], [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
