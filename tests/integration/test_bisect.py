"""culprit bisect, end to end under real mpirun: injected faults (every phase; transient, persistent and
intermittent; different ranks, layers and steps; mlp, cnn and gpt; bisect world sizes other than the
run's) are named exactly in diagnosis.json — step, layer, phase, rank and verdict — including silent
faults no detector caught; a clean run gives none, noise on every rank software-nondeterminism, a
learning rate that blows up numerical-instability with no rank blamed."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import unittest
from html.parser import HTMLParser

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (EXIT_DAMAGED, EXIT_USAGE, VERDICTS, TempDirTest, diagnosis, last_culprit_line,  # noqa: E402
                             run, run_each_rank_code, verdict_line)

SIZE = {"mlp": ["--global-batch", "24", "--micro-shards", "4", "--samples", "96"],
        "cnn": ["--global-batch", "16", "--micro-shards", "4", "--samples", "64"],
        "gpt": ["--global-batch", "8", "--micro-shards", "4", "--samples", "32", "--optimizer", "adamw",
                "--lr", "0.003"]}

# (model, training W, bisect W, spec, verdict, step, phase, layer, rank)
CASES = [
    ("mlp", 3, 2, "step=5,rank=1,layer=fc2,index=3,phase=forward,kind=bitflip,bit=22",
     "hardware-transient", 5, "forward", "fc2", 1),
    ("mlp", 2, 3, "step=4,rank=1,layer=fc1,index=7,phase=backward,kind=bitflip,bit=22,mode=persistent",
     "hardware-persistent", 4, "backward", "fc1", 1),
    ("mlp", 4, 4, "step=6,rank=2,layer=fc2,index=1,phase=grad,kind=scale,factor=3",
     "hardware-transient", 6, "grad", "fc2", 2),
    ("mlp", 3, 3, "step=5,rank=2,index=4,phase=data,kind=bitflip,bit=22", "data", 5, "data", "", 2),
    ("mlp", 3, 3, "step=5,rank=1,layer=fc1,index=2,phase=param,kind=bitflip,bit=22",
     "hardware-transient", 5, "param", "fc1", 1),
    ("mlp", 3, 2, "step=3,rank=2,layer=fc2,index=2,phase=param,kind=scale,factor=2,mode=persistent",
     "hardware-unconfirmed", 3, "param", "fc2", 2),  # rank 2 is not in the bisect world: never rerun
    ("mlp", 3, 3, "step=3,rank=2,layer=fc2,index=2,phase=param,kind=scale,factor=2,mode=persistent",
     "hardware-persistent", 3, "param", "fc2", 2),
    ("mlp", 3, 3, "step=5,rank=1,layer=fc2,index=3,phase=optimizer,kind=bitflip,bit=22",
     "hardware-transient", 5, "optimizer", "fc2", 1),
    ("mlp", 3, 2, "step=4,rank=1,layer=fc2,index=3,phase=comm,kind=bitflip,bit=30",
     "hardware-transient", 4, "comm", "fc2", 1),
    ("cnn", 2, 3, "step=3,rank=0,layer=conv2,index=11,phase=forward,kind=bitflip,bit=22,mode=persistent",
     "hardware-persistent", 3, "forward", "conv2", 0),
    ("gpt", 4, 2, "step=4,rank=3,layer=blocks.0.mlp.fc,index=5,phase=forward,kind=bitflip,bit=22",
     "hardware-unconfirmed", 4, "forward", "blocks.0.mlp.fc", 3),
    # The other phase x mode cells, on other models, ranks, layers and steps.
    ("mlp", 3, 3, "step=5,rank=0,layer=fc1,index=3,phase=grad,kind=bitflip,bit=22,mode=persistent",
     "hardware-persistent", 5, "grad", "fc1", 0),
    ("mlp", 4, 3, "step=6,rank=3,layer=fc2,index=2,phase=backward,kind=bitflip,bit=22",
     "hardware-unconfirmed", 6, "backward", "fc2", 3),
    ("mlp", 3, 3, "step=5,rank=2,layer=fc1,index=2,phase=optimizer,kind=bitflip,bit=22,mode=persistent",
     "hardware-persistent", 5, "optimizer", "fc1", 2),
    ("mlp", 3, 3, "step=4,rank=1,layer=fc1,index=3,phase=comm,kind=bitflip,bit=30,mode=persistent",
     "hardware-persistent", 4, "comm", "fc1", 1),
    # A silent link fault (no online comm check): the replay's own comm check names the sender.
    ("mlp", 3, 3, "step=4,rank=2,layer=fc2,index=1,phase=comm,kind=bitflip,bit=30,mode=persistent --comm-check false",
     "hardware-persistent", 4, "comm", "fc2", 2),
    ("cnn", 3, 2, "step=5,rank=1,layer=conv1,index=5,phase=grad,kind=scale,factor=3",
     "hardware-transient", 5, "grad", "conv1", 1),
    ("cnn", 4, 2, "step=3,rank=2,index=7,phase=data,kind=bitflip,bit=22", "data", 3, "data", "", 2),
    ("cnn", 3, 3, "step=5,rank=1,index=3,phase=data,kind=bitflip,bit=22,mode=persistent", "data", 5, "data", "", 1),
    ("cnn", 3, 3, "step=4,rank=2,layer=conv2,index=2,phase=comm,kind=bitflip,bit=30",
     "hardware-transient", 4, "comm", "conv2", 2),
    ("gpt", 3, 3, "step=5,rank=2,layer=blocks.0.mlp.fc,index=2,phase=grad,kind=bitflip,bit=22,mode=persistent",
     "hardware-persistent", 5, "grad", "blocks.0.mlp.fc", 2),
    ("gpt", 2, 3, "step=4,rank=0,layer=blocks.0.mlp.fc,index=4,phase=param,kind=bitflip,bit=22",
     "hardware-transient", 4, "param", "blocks.0.mlp.fc", 0),
    ("gpt", 4, 4, "step=6,rank=1,layer=blocks.0.mlp.fc,index=1,phase=optimizer,kind=bitflip,bit=22",
     "hardware-transient", 6, "optimizer", "blocks.0.mlp.fc", 1),
    # Bisecting a persistent fault on two ranks: each reproduces its own result. A computation's tie
    # is settled by its float64 recomputation (the third opinion); a load's by the data source read
    # afresh on both ranks (no other device loaded those samples): the loading rank, exactly.
    ("mlp", 2, 2, "step=4,rank=1,index=4,phase=data,kind=bitflip,bit=22,mode=persistent", "data", 4, "data", "", 1),
    ("cnn", 2, 2, "step=4,rank=1,layer=fc,index=1,phase=backward,kind=bitflip,bit=22,mode=persistent",
     "hardware-persistent", 4, "backward", "fc", 1),
]


class Elements(HTMLParser):
    """Every element's tag and attributes."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))


def check_report(test, html, step, origin=None):
    """diagnosis.html holds both plots, the faulty step marked in each, and differing cells there; the
    map's rows are in execution order, so the first differing cell of the faulty step is `origin`;
    the loss plot's legend lies below its axis, clear of the plot and its labels."""
    p = Elements()
    p.feed(html)
    rows = []
    for t, a in p.found:
        if t == "rect" and a.get("data-step") == str(step) and a.get("data-row") not in rows:
            rows.append(a.get("data-row"))
    first = next((a["data-row"] for t, a in p.found
                  if t == "rect" and a.get("data-step") == str(step) and a.get("class") == "differ"), None)
    if origin:
        test.assertEqual(first, origin, rows)
        test.assertLess(rows.index("forward " + origin.split(" ", 1)[1]), rows.index("backward " + origin.split(" ", 1)[1]))
    svg_tags = [a for t, a in p.found if t == "svg" and a.get("id") == "loss-plot"]
    axis_y = max(float(a["y1"]) for t, a in p.found if t == "line" and "y1" in a and a.get("y1") == a.get("y2"))
    legend = [a for t, a in p.found if t == "rect" and a.get("width") == "10" and a.get("height") == "10"]
    test.assertTrue(legend)
    for a in legend:
        test.assertGreater(float(a["y"]), axis_y)
        test.assertLessEqual(float(a["y"]) + 10, float(svg_tags[0]["height"]))
        test.assertLessEqual(float(a["x"]) + 60, float(svg_tags[0]["width"]))
    ids = {a.get("id"): (t, a) for t, a in p.found if a.get("id")}
    test.assertEqual(ids["loss-plot"][0], "svg")
    test.assertEqual(ids["layer-map"][0], "svg")
    test.assertEqual(ids["faulty-step-marker"][1]["data-step"], str(step))
    test.assertEqual(ids["faulty-step-column"][1]["data-step"], str(step))
    differ = [a for t, a in p.found if t == "rect" and a.get("class") == "differ"]
    test.assertTrue(differ and all(a["data-step"] == str(step) for a in differ), differ)
    test.assertTrue([a for t, a in p.found if t == "polyline" and a.get("class") == "rank"])
    # The x axis labels integer steps, several of them, in order.
    ticks = [int(a["data-step"]) for t, a in p.found if t == "g" and a.get("class") == "x-tick"]
    test.assertGreaterEqual(len(ticks), 5, ticks)
    test.assertEqual(ticks, sorted(set(ticks)))
    # The layer map's label column is wider than its longest row name set in its monospace font
    # (0.6 em at 11 px: 6.6 px a character), and every cell lies right of it.
    names = [a["data-row"] for t, a in p.found if t == "rect" and "data-row" in a]
    cells_x = [float(a["x"]) for t, a in p.found if t == "rect" and "data-row" in a]
    label_w = float(ids["layer-map"][1]["data-label-width"])
    test.assertGreater(label_w, 4 + 6.6 * max(len(n) for n in names))
    test.assertGreaterEqual(min(cells_x), label_w)
    for t, a in p.found:
        if t == "text" and a.get("class") == "row-label":
            test.assertEqual(a.get("font-family"), "monospace")
    # Each replay fault once.
    faults = re.search(r'<ul id="replay-faults">(.*?)</ul>', html, re.S)
    if faults:
        items = re.findall(r"<li>(.*?)</li>", faults.group(1))
        test.assertEqual(len(items), len(set(items)), items)


def check_losses(test, html, run_dir):
    """The loss plot's points are the step losses culprit printed (metrics.jsonl), step for step."""
    p = Elements()
    p.feed(html)
    plotted = {int(a["data-step"]): float(a["data-loss"]) for t, a in p.found
               if t == "circle" and a.get("class") == "step-loss"}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        printed = {m["step"]: m["loss"] for m in map(json.loads, f) if m["loss"] is not None}
    test.assertEqual(sorted(plotted), sorted(printed))
    for step, loss in printed.items():
        test.assertEqual(struct.pack("f", plotted[step]), struct.pack("f", loss), step)


class Bisect(TempDirTest):
    def trained(self, name, model, world, extra):
        """`model` trained with `extra` on `world` ranks: its run directory."""
        return self.train(name, ["--model", model, "--steps", "8", "--checkpoint-every", "2", "--keep-last", "10",
                                 "--trace", "layer", "--on-detect", "warn"] + SIZE[model] + extra, world).run_dir

    def test_injected_faults_are_named_exactly(self):
        for i, (model, wt, wb, spec, verdict, step, phase, layer, rank) in enumerate(CASES):
            with self.subTest(model=model, spec=spec, bisect_world=wb):
                inject, *extra = spec.split(" ", 1)
                d = self.trained("case%d" % i, model, wt, ["--inject", inject] + (extra[0].split() if extra else []))
                got = self.bisect(d, wb, verdict)
                self.assertEqual((got["verdict"], got["step"], got["phase"], got["layer"], got["rank"]),
                                 (verdict, step, phase, layer, rank), got)
                self.assertEqual(bool(got["host"]), rank >= 0, got)
                self.assertEqual(got["device"], "cpu" if rank >= 0 else "")
                self.assertTrue(got["evidence"], got)
                self.assertGreaterEqual(got["steps_replayed"], 1)
                self.assertEqual(got["candidates"], [], got)  # every case is settled: no tie left
                if verdict == "hardware-persistent" and phase not in ("param", "optimizer", "comm"):
                    self.assertEqual((got["reruns"], got["reproduced"]), (8, 8), got)
                if verdict == "hardware-unconfirmed":
                    self.assertEqual(got["reruns"], 0, got)
                    self.assertTrue(any("not part of this bisection" in e for e in got["evidence"]), got)
                if verdict == "hardware-transient" and rank < wb and phase in ("forward", "backward", "grad"):
                    self.assertEqual((got["reruns"], got["reproduced"]), (8, 0), got)

    def test_report_opens_in_a_browser(self):
        # A persistent fault fires again in every replay of its step: diagnosis.json records each
        # firing, the page lists each distinct one once, with its count.
        d = self.trained("report", "mlp", 3, ["--inject", "step=5,rank=1,layer=fc2,index=3,phase=forward,kind=bitflip,"
                                                          "bit=22,mode=persistent"])
        got = self.bisect(d, 2, "hardware-persistent")
        page = os.path.join(d, "diagnosis.html")
        with open(page) as f:
            html = f.read()
        check_report(self, html, got["step"], origin="forward fc2")
        check_losses(self, html, d)
        distinct = {(f["step"], f["rank"], f["host"], f["what"]) for f in got["replay_faults"]}
        self.assertGreater(len(got["replay_faults"]), len(distinct), got["replay_faults"])
        items = re.findall(r"<li>(.*?)</li>", re.search(r'<ul id="replay-faults">(.*?)</ul>', html, re.S).group(1))
        self.assertEqual(len(items), len(distinct), items)
        self.assertIn("(%d times)" % len(got["replay_faults"]), items[0])
        # Headless Chromium (Debian's chromium, installed by scripts/setup.sh) loads it; the DOM it
        # builds holds the same elements.
        browser = shutil.which("chromium")
        self.assertIsNotNone(browser, "chromium is missing (scripts/setup.sh installs it)")
        res = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "file://" + page],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        check_report(self, res.stdout, got["step"], origin="forward fc2")
        check_losses(self, res.stdout, d)
        # And it renders: a screenshot of the page as Chromium lays it out.
        shot = os.path.join(d, "diagnosis.png")
        res = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,1400",
                              "--screenshot=" + shot, "file://" + page], capture_output=True, text=True, timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertGreater(os.path.getsize(shot), 10000)

    def test_intermittent_fault_reproduces_now_and_then(self):
        d = self.trained("intermittent", "mlp", 3,
                         ["--inject", "step=5,rank=1,layer=fc2,index=3,phase=forward,kind=scale,factor=2,"
                                      "mode=intermittent,p=0.6"])
        res = run(["bisect", "--run-dir", d, "--reruns", "12"], world=3, use_mpirun=True)
        got = diagnosis(d)
        self.assertIn(got["verdict"], ("hardware-persistent", "hardware-transient"), res.out + res.err)
        self.assertEqual((got["phase"], got["layer"], got["rank"]), ("forward", "fc2", 1), got)
        self.assertGreaterEqual(got["step"], 5)
        self.assertEqual(got["reruns"], 12)
        self.assertGreater(got["reproduced"], 0, got)  # 12 draws at p = 0.6: all missing has p 1.7e-5
        self.assertLess(got["reproduced"], 12, got)     # all hitting has p 2.2e-3

    def test_intermittent_faults_in_every_other_phase(self):
        # (model, spec, phase, layer, rank): the first step the fault hit is at or after step=.
        cases = [
            ("gpt", "step=4,rank=1,layer=blocks.0.attn.proj,index=2,phase=backward,kind=scale,factor=2",
             "backward", "blocks.0.attn.proj", 1),
            ("cnn", "step=4,rank=2,layer=conv1,index=2,phase=grad,kind=scale,factor=2", "grad", "conv1", 2),
            ("mlp", "step=4,rank=2,layer=fc1,index=2,phase=param,kind=scale,factor=2", "param", "fc1", 2),
            ("mlp", "step=4,rank=1,layer=fc1,index=2,phase=comm,kind=bitflip,bit=30", "comm", "fc1", 1),
            ("mlp", "step=4,rank=1,index=2,phase=data,kind=bitflip,bit=22", "data", "", 1),
            ("mlp", "step=4,rank=0,layer=fc2,index=2,phase=optimizer,kind=bitflip,bit=22", "optimizer", "fc2", 0),
        ]
        for i, (model, spec, phase, layer, rank) in enumerate(cases):
            with self.subTest(spec=spec):
                d = self.trained("intermittent%d" % i, model, 3, ["--inject", spec + ",mode=intermittent,p=0.6"])
                res = run(["bisect", "--run-dir", d, "--reruns", "12"], world=3, use_mpirun=True)
                got = diagnosis(d)
                verdicts = ("data",) if phase == "data" else ("hardware-persistent", "hardware-transient")
                self.assertIn(got["verdict"], verdicts, res.out + res.err)
                self.assertEqual((got["phase"], got["layer"], got["rank"]), (phase, layer, rank), got)
                self.assertIn(got["step"], (4, 5, 6), got)
                if phase in ("forward", "backward", "grad"):
                    self.assertEqual(got["reruns"], 12, got)
                    self.assertGreater(got["reproduced"], 0, got)

    def test_clean_run_noise_and_instability(self):
        got = self.bisect(self.trained("clean", "mlp", 3, []), 2, "none")
        self.assertEqual((got["step"], got["rank"]), (-1, -1), got)
        got = self.bisect(self.trained("noise", "mlp", 3, ["--inject", "step=4,rank=all,layer=fc2,phase=forward,"
                                                                       "kind=noise,mode=persistent"]), 3,
                          "software-nondeterminism")
        self.assertEqual((got["step"], got["rank"]), (4, -1), got)
        d = self.trained("blowup", "mlp", 2, ["--lr", "60"])
        with open(os.path.join(d, "metrics.jsonl")) as f:
            first_nan = next(json.loads(l)["step"] for l in f if json.loads(l)["loss"] is None)
        got = self.bisect(d, 3, "numerical-instability")
        self.assertEqual((got["step"], got["rank"]), (first_nan, -1), got)

    def test_on_detect_diagnose_runs_the_bisection_in_the_job(self):
        # A NaN in rank 1's forward pass halts the job; the bisection runs in it and its verdict is the
        # exit code of every rank, naming the host to exclude.
        d = self.path("diagnose")
        workdir = self.path("diagnose-rc")
        os.makedirs(workdir)
        codes, out, err = run_each_rank_code(
            ["train", "--run-dir", d, "--model", "mlp", "--steps", "8", "--trace", "layer", "--quiet",
             "--on-detect", "diagnose", "--inject", "step=3,rank=1,layer=fc2,index=3,phase=forward,kind=nan"]
            + SIZE["mlp"], 3, workdir)
        self.assertEqual(codes, [VERDICTS["hardware-transient"]] * 3, err)
        self.assertIn("halted at step 3 by the nonfinite detector", err)
        self.assertRegex(err, r"culprit: exclude host \S+ \(rank 1, device cpu\) before requeueing: hardware-transient")
        self.assertEqual(last_culprit_line(err), verdict_line("hardware-transient", d), err)
        got = diagnosis(d)
        self.assertEqual((got["verdict"], got["step"], got["phase"], got["layer"], got["rank"]),
                         ("hardware-transient", 3, "forward", "fc2", 1), got)
        # diagnose needs the trace.
        res = run(["train", "--on-detect", "diagnose", "--trace", "off", "--quiet"] + SIZE["mlp"], world=2,
                  run_dir=self.path("diagnose-notrace"))
        self.assertEqual(res.code, EXIT_USAGE, res.err)
        self.assertIn("--on-detect diagnose' needs the trace", res.err)

    def test_a_damaged_oldest_checkpoint_is_named_in_the_coverage(self):
        # A silent fault at step 1 of a run whose step-0 checkpoint is damaged: nothing before the
        # next checkpoint can be replayed, and the coverage says which checkpoint and why.
        import h5py
        import numpy as np
        d = self.trained("oldest", "mlp", 2, [])
        oldest = os.path.join(d, "checkpoints", "step-00000000.h5")
        with h5py.File(oldest, "r+") as f:
            w = f["model/fc1.weight"]
            w[0, 0] = w[0, 0] * np.float32(2)  # a value changed at rest: its fingerprint fails
        got = self.bisect(d, 2, "inconclusive")
        gaps = [g for g in got["coverage"]["not_examined"] if g["from"] == 1]
        self.assertEqual(len(gaps), 1, got["coverage"])
        self.assertEqual(gaps[0]["to"], 2, got["coverage"])
        reason = gaps[0]["reason"]
        self.assertIn("no valid checkpoint before step 3 to replay from: checkpoint '%s' is damaged (" % oldest, reason)
        self.assertIn("is damaged (dataset '/model/fc1.weight': fingerprint mismatch", reason)  # why
        # Negative control: intact, the same run's steps are all examined.
        clean = self.bisect(self.trained("oldest-clean", "mlp", 2, []), 2, "none")
        self.assertEqual(clean["coverage"]["not_examined"], [], clean["coverage"])

    def test_bad_input(self):
        res = run(["train", "--model", "mlp", "--steps", "3", "--trace", "off", "--quiet"] + SIZE["mlp"], world=1,
                  run_dir=self.path("notrace"))
        self.assertEqual(res.code, 0, res.err)
        d = self.trained("nockpt", "mlp", 1, [])
        for f in os.listdir(os.path.join(d, "checkpoints")):
            os.remove(os.path.join(d, "checkpoints", f))
        torn = self.trained("torn", "mlp", 2, [])
        path = os.path.join(torn, "trace", "rank-00001.h5")
        with open(path, "rb") as f:
            blob = f.read()
        with open(path, "wb") as f:
            f.write(blob[: len(blob) // 2])
        for args, needle, code in [(["--run-dir", self.path("missing")], "holds no run (no run.json)", EXIT_USAGE),
                                   (["--run-dir", torn], "trace '%s'" % path, EXIT_DAMAGED),
                                   (["--run-dir", self.path("notrace")], "no trace in", EXIT_USAGE),
                                   (["--run-dir", d], "no valid checkpoint", EXIT_USAGE),
                                   (["--run-dir", d, "--reruns", "0"], "'--reruns' must be in [1, 1000], got 0",
                                    EXIT_USAGE),
                                   ([], "option '--run-dir' is required", EXIT_USAGE)]:
            with self.subTest(args=args):
                res = run(["bisect"] + args, world=2, use_mpirun=True)
                self.assertEqual(res.code, code, res.out + res.err)
                self.assertIn("culprit: error: ", res.err)
                self.assertIn(needle, res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
