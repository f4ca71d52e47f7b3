"""The vote's arrangements decide alike (docs/detection.md, the vote; docs/scale.md 2.1): at 4 ranks,
each fault caught by a record-based decision — a NaN (nonfinite), a corrupted reduction message (comm),
a diverged replica, a broken invariant (the learning rate) — and a clean run give the same incidents
(every field but the time), exit codes and per-step metrics (loss, fingerprint) whether the vote's
summary runs over one node (MPI_COMM_TYPE_SHARED on this machine), over 2 nodes of 2 ranks or 4 of 1
(CULPRIT_NODE_SPLIT, the test seam), or the records are gathered every step as before the summary
(CULPRIT_VOTE_GATHER)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, incidents, metrics, run_each_rank_code  # noqa: E402

W = 4
BASE = ["--model", "mlp", "--steps", "5", "--global-batch", "16", "--micro-shards", "4", "--samples", "64",
        "--checkpoint-every", "0", "--trace", "off", "--quiet"]
FAULTS = {
    "clean": [],
    "nan": ["--inject", "step=3,rank=2,layer=fc2,phase=forward,kind=nan"],
    "comm": ["--inject", "step=3,rank=2,layer=fc2,index=5,phase=comm,kind=bitflip,bit=3"],  # rank 1 owns its chunk,
    "replica": ["--inject", "step=3,rank=3,layer=fc2,index=5,phase=param,kind=bitflip,bit=3"],
    "invariant": ["--inject", "step=3,rank=1,phase=lr,kind=scale,factor=2"],
}
ARRANGEMENTS = {"gather": {"CULPRIT_VOTE_GATHER": "1"}, "shared": {}, "nodes2x2": {"CULPRIT_NODE_SPLIT": "2"},
                "nodes4x1": {"CULPRIT_NODE_SPLIT": "1"}}


class VoteArrangements(TempDirTest):
    def outcome(self, name, fault, arrangement):
        run_dir, workdir = self.path(name), self.path(name + "-rc")
        os.makedirs(workdir)
        env = dict(os.environ)
        for k in ("CULPRIT_VOTE_GATHER", "CULPRIT_NODE_SPLIT"):
            env.pop(k, None)
        env.update(ARRANGEMENTS[arrangement])
        codes, _, err = run_each_rank_code(["train", "--run-dir", run_dir] + BASE + FAULTS[fault], W, workdir, env=env)
        inc = [{k: v for k, v in i.items() if k != "time"} for i in incidents(run_dir)]
        steps = [(m["step"], m["loss"], m["fingerprint"]) for m in metrics(run_dir)]
        return codes, inc, steps, err

    def test_every_arrangement_decides_alike(self):
        for fault in FAULTS:
            with self.subTest(fault=fault):
                ref = None
                for arrangement in ARRANGEMENTS:
                    codes, inc, steps, err = self.outcome("%s-%s" % (fault, arrangement), fault, arrangement)
                    if fault == "clean":
                        self.assertEqual((codes, inc), ([0] * W, []), err)
                    else:
                        self.assertTrue(inc and inc[0]["step"] == 3, (arrangement, inc, err))
                    if ref is None:
                        ref = (codes, inc, steps)
                    self.assertEqual((codes, inc, steps), ref, arrangement)


if __name__ == "__main__":
    unittest.main()
