"""A bounded trace (--trace-keep N, docs/checkpoint-format.md "Rolled traces"), end to end under real
mpirun on real HDF5 files: the live file rolls at checkpoints and old files are deleted, so the
trace's size stops growing; every row kept is the row an unrolled twin of the run wrote; a resume
from an older checkpoint rewinds the rolled files; an incident stops the deletion; and a bisection
says which steps it could not examine because their rows were retired, instead of calling them
clean. Truth is the unrolled twin and the injected fault, never culprit's own output."""
import glob
import os
import sys
import unittest

import h5py

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, diagnosis, run  # noqa: E402

ARGS = ["--model", "mlp", "--global-batch", "24", "--micro-shards", "4", "--samples", "96", "--checkpoint-every", "5",
        "--trace", "layer", "--on-detect", "warn"]
FAULT = "step=130,rank=1,layer=fc2,index=3,phase=forward,kind=bitflip,bit=22"


def rows(run_dir, rank):
    """{step: (loss, grad_fp, param_fps, opt_fps)} of one rank, every trace file of it merged; the
    number of files, and the steps recorded twice (none should be)."""
    out, twice = {}, []
    files = sorted(glob.glob(os.path.join(run_dir, "trace", "rank-%05d*.h5" % rank)))
    for path in files:
        with h5py.File(path, "r") as f:
            g = f["steps"]
            for i in range(int(f.attrs["steps_committed"])):
                s = int(g["step"][i])
                if s in out:
                    twice.append(s)
                out[s] = (float(g["loss"][i]), int(g["grad_fp"][i]), tuple(g["param_fp"][i]), tuple(g["opt_fp"][i]))
    return out, len(files), twice


def trace_bytes(run_dir):
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(run_dir, "trace", "*")))


class TraceKeep(TempDirTest):
    def twin(self, steps, world=2):
        """The same run with the whole trace: the truth every kept row is compared with."""
        return self.train("twin%d" % steps, ARGS + ["--steps", str(steps)], world).run_dir

    def assert_rows_are_the_twins(self, d, twin, ranks, first, last):
        for r in range(ranks):
            got, _, twice = rows(d, r)
            want, _, _ = rows(twin, r)
            self.assertEqual(twice, [], "rank %d: steps recorded twice" % r)
            self.assertEqual(sorted(got), list(range(first, last + 1)), "rank %d" % r)
            for s in got:
                self.assertEqual(got[s], want[s], "rank %d step %d differs from the unrolled run's row" % (r, s))

    def test_the_trace_stops_growing_and_keeps_the_newest_steps_as_written(self):
        # N = 40: files of 64 steps (one HDF5 chunk of rows), sealed at checkpoints (every 5).
        d = self.path("rolled")
        self.train("rolled", ARGS + ["--steps", "200", "--trace-keep", "40"], 2)
        rolled_200 = trace_bytes(d)
        self.assertEqual(run(["train", "--resume", "--steps", "400", "--quiet"], world=2, run_dir=d).code, 0)
        rolled_400 = trace_bytes(d)
        twin = self.twin(200)
        twin_200 = trace_bytes(twin)
        self.assertEqual(run(["train", "--resume", "--steps", "400", "--quiet"], world=2, run_dir=twin).code, 0)
        twin_400 = trace_bytes(twin)
        first = min(rows(d, 0)[0])
        self.assertGreaterEqual(400 - first + 1, 40)           # the newest N steps at least
        self.assertLessEqual(400 - first + 1, 40 + 64 + 5)     # and at most a file and a checkpoint more
        self.assert_rows_are_the_twins(d, twin, 2, first, 400)
        for r in range(2):
            self.assertLessEqual(rows(d, r)[1], 3, "rank %d: too many trace files" % r)
        self.assertLessEqual(rolled_400, rolled_200 * 1.1, (rolled_200, rolled_400))
        # Negative control: the whole trace grows with the run.
        self.assertGreater(twin_400, 1.5 * twin_200, (twin_200, twin_400))
        self.assertLess(rolled_400, twin_400, (rolled_400, twin_400))
        res = run(["verify", d])
        self.assertEqual(res.code, 0, res.out + res.err)

    def test_a_resume_from_an_older_checkpoint_rewinds_the_rolled_files(self):
        # N = 40: files sealed at steps 65 and 130; the resume point (step 125) lies inside the
        # newest sealed file, which becomes the live one again.
        d = self.path("rewound")
        self.train("rewound", ARGS + ["--steps", "130", "--trace-keep", "40"], 2)
        self.assertTrue(os.path.exists(os.path.join(d, "trace", "rank-00000.to-00000130.h5")))
        os.remove(os.path.join(d, "checkpoints", "step-00000130.h5"))
        self.assertEqual(run(["train", "--resume", "--steps", "160", "--quiet"], world=2, run_dir=d).code, 0)
        twin = self.twin(160)
        first = min(rows(d, 0)[0])
        self.assertLessEqual(first, 160 - 40 + 1)
        self.assert_rows_are_the_twins(d, twin, 2, first, 160)
        # Resumed on one rank: rank 1's files keep what precedes the resume point only.
        os.remove(os.path.join(d, "checkpoints", "step-00000160.h5"))
        self.assertEqual(run(["train", "--resume", "--steps", "170", "--quiet"], run_dir=d).code, 0)
        self.assertEqual(max(rows(d, 1)[0]), 155)
        res = run(["verify", d])
        self.assertEqual(res.code, 0, res.out + res.err)

    def test_every_rank_rolls_at_the_same_steps_when_the_world_changes(self):
        # Trained on 2 ranks (files sealed at 65 and 130), resumed on 3 (rank 2 is new: it must seal
        # where the others do, not at once), then on 1 (ranks 1 and 2 are beyond the world: their
        # files must still age).
        d = self.path("worlds")
        self.train("worlds", ARGS + ["--steps", "130", "--trace-keep", "40"], 2)
        self.assertEqual(run(["train", "--resume", "--steps", "260", "--quiet"], world=3, run_dir=d).code, 0)
        sealed = lambda r: sorted(os.path.basename(p).split(".to-")[1] for p in
                                  glob.glob(os.path.join(d, "trace", "rank-%05d.to-*.h5" % r)))
        self.assertEqual(sealed(2), sealed(0))
        self.assertEqual(sealed(0), ["00000260.h5"])  # sealed at 195 and 260; 195 retired at 260
        # Every kept step has a row of each of its 4 micro-shards, from whichever rank computed it.
        shards = {}
        for path in glob.glob(os.path.join(d, "trace", "*.h5")):
            with h5py.File(path, "r") as f:
                for i in range(int(f.attrs["shards_committed"])):
                    shards.setdefault(int(f["shards/step"][i]), set()).add(int(f["shards/shard"][i]))
        self.assertEqual({s: k for s, k in shards.items() if k != {0, 1, 2, 3}}, {})
        self.assertEqual(min(shards), min(rows(d, 0)[0]))
        self.assertEqual(run(["train", "--resume", "--steps", "400", "--quiet"], run_dir=d).code, 0)
        for r in (1, 2):  # their rows all end at 260, long before the newest 40 steps
            self.assertEqual(sealed(r), [])
            self.assertEqual(rows(d, r)[0], {})
        res = run(["verify", d])
        self.assertEqual(res.code, 0, res.out + res.err)

    def test_a_bisection_names_the_steps_whose_rows_were_retired(self):
        # A silent fault at step 130 of 140, N = 20: files sealed at 65 and 130, the first deleted;
        # the fault's rows are kept. With ten checkpoints kept the search starts inside the kept
        # steps and finds it; with three it cannot reach step 130 and says so: inconclusive, never
        # "none".
        for keep_last, verdict in (("10", "hardware-transient"), ("3", "inconclusive")):
            with self.subTest(keep_last=keep_last):
                name = "silent" + keep_last
                self.train(name, ARGS + ["--steps", "140", "--trace-keep", "20", "--keep-last", keep_last,
                                         "--inject", FAULT], 3)
                d = self.path(name)
                self.assertEqual(min(rows(d, 0)[0]), 66)
                res = run(["bisect", "--run-dir", d], world=2, use_mpirun=True)
                got = diagnosis(d)
                self.assertEqual(got["verdict"], verdict, res.out + res.err)
                gaps = got["coverage"]["not_examined"]
                retired = [g for g in gaps if "retired by --trace-keep 20" in g["reason"]]
                self.assertEqual([(g["from"], g["to"]) for g in retired], [(1, 65)], gaps)
                if verdict == "hardware-transient":
                    self.assertEqual((got["step"], got["layer"], got["rank"]), (130, "fc2", 1), got)
                else:
                    self.assertTrue(any(g["from"] <= 130 <= g["to"] for g in gaps), gaps)
                    self.assertEqual(got["step"], -1, got)

    def test_an_incident_keeps_every_trace_file_from_then_on(self):
        # A NaN at step 100 (warn: the run goes on to 160, then is resumed to 180), N = 20. Before
        # it, the file sealed at 65 is deleted (at checkpoint 95); from it on, none is.
        d = self.path("pinned")
        self.train("pinned", ARGS + ["--steps", "160", "--trace-keep", "20", "--inject",
                                     "step=100,rank=0,layer=fc1,index=0,phase=forward,kind=nan"], 2)
        self.assertEqual(min(rows(d, 0)[0]), 66)
        self.assertEqual(run(["train", "--resume", "--steps", "180", "--quiet"], world=2, run_dir=d).code, 0)
        self.assertEqual(min(rows(d, 0)[0]), 66)  # the resumed job knows of the incident too
        self.assertEqual(sorted(rows(d, 1)[0]), list(range(66, 181)))
        res = run(["bisect", "--run-dir", d], world=2, use_mpirun=True)
        got = diagnosis(d)
        self.assertEqual(got["step"], 100, res.out + res.err)
        # Negative control: the same run without the incident keeps only its newest steps.
        self.train("unpinned", ARGS + ["--steps", "160", "--trace-keep", "20"], 2)
        self.assertEqual(min(rows(self.path("unpinned"), 0)[0]), 131)


if __name__ == "__main__":
    unittest.main()
