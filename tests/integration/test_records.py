"""The run's records through their one reader and writer: `culprit report --field` gives what an
independent JSON reader finds in diagnosis.json and incidents.jsonl, `culprit log` appends a job
script's decision in the incident schema, and damaged, foreign or newer records are refused with one
line and a documented exit code."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import EXIT_DAMAGED, EXIT_USAGE, TempDirTest, incidents, run  # noqa: E402

ARGS = ["--model", "mlp", "--steps", "6", "--global-batch", "24", "--micro-shards", "4", "--samples", "96",
        "--checkpoint-every", "2", "--quiet", "--on-detect", "warn"]


class Records(TempDirTest):
    def report(self, *args):
        return run(["report"] + list(args))

    def field(self, run_dir, name, *extra):
        res = self.report(run_dir, "--field", name, *extra)
        self.assertEqual(res.code, 0, res.err)
        return res.out.rstrip("\n")

    def test_fields_are_the_records_own(self):
        d = self.path("opt")
        # A persistent optimizer-state fault on rank 2 of 3: the replica check names the tensor and
        # says it is optimizer state; the bisection moves the fault to the optimizer phase.
        res = run(["train"] + ARGS + ["--inject", "step=3,rank=2,layer=fc2,index=5,phase=optimizer,kind=scale,"
                                      "factor=3,mode=persistent"], world=3, run_dir=d)
        self.assertEqual(res.code, 0, res.err)
        inc = incidents(d)
        self.assertTrue(inc)
        first = inc[0]
        self.assertEqual((first["record"], first["version"], first["detector"], first["what"], first["tensor"],
                          first["rank"]), ("incident", 1, "replica-divergence", "optimizer-state", "fc2.weight", 2))
        for name in ("step", "detector", "class", "rank", "tensor", "what", "host", "message"):
            self.assertEqual(self.field(d, "incident." + name, "--which", "first"), str(first[name]), name)
        self.assertEqual(self.field(d, "incident.ranks", "--which", "first"), ",".join(map(str, first["ranks"])))
        self.assertEqual(self.field(d, "incident.step", "--which", "last"), str(inc[-1]["step"]))
        bis = run(["bisect", "--run-dir", d], world=3, use_mpirun=True)
        self.assertIn(bis.code, (20, 21), bis.out + bis.err)
        diag = json.load(open(os.path.join(d, "diagnosis.json")))
        self.assertEqual((diag["record"], diag["version"], diag["phase"], diag["rank"]), ("diagnosis", 2, "optimizer", 2))
        for name in ("verdict", "step", "layer", "phase", "rank", "host", "device", "reruns"):
            self.assertEqual(self.field(d, "diagnosis." + name), str(diag[name]), name)
        summary = self.report(d)
        self.assertEqual(summary.code, 0, summary.err)
        self.assertIn("diagnosis: %s, step %d, phase optimizer" % (diag["verdict"], diag["step"]), summary.out)
        self.assertIn("incidents: %d" % len(inc), summary.out)

    def test_log_appends_a_decision_in_the_incident_schema(self):
        d = self.path("clean")
        self.train("clean", ARGS)
        res = run(["log", d, "--decision", "requeue", "--step", "5", "--exit-code", "21", "--host", "node3",
                   "--restart", "1", "--exclude", "node3,node9", "--resume-from", "x.h5", "--next-job", "77",
                   "--message", 'say "why"'])
        self.assertEqual(res.code, 0, res.err)
        rec = incidents(d)[-1]
        self.assertEqual((rec["detector"], rec["class"], rec["decision"], rec["step"], rec["exit_code"], rec["host"],
                          rec["restart"], rec["exclude"], rec["resume_from"], rec["next_job"], rec["message"]),
                         ("jobs", "jobs", "requeue", 5, 21, "node3", 1, "node3,node9", "x.h5", "77", 'say "why"'))
        with open(os.path.join(d, "incidents.log")) as f:
            line = f.read().splitlines()[-1]
        self.assertIn("detector=jobs class=jobs rank=-1 host=node3", line)
        self.assertIn("decision=requeue restart=1 exit_code=21 exclude=node3,node9", line)
        self.assertTrue(line.endswith("message=\"say 'why'\""), line)
        self.assertEqual(self.field(d, "incident.decision", "--detector", "jobs"), "requeue")

    def test_numbers_and_steps_of_a_record_are_checked(self):
        d = self.path("r")
        self.train("r", ARGS[:2] + ["--steps", "2", "--checkpoint-every", "2"])
        res = run(["log", d, "--decision", "stop", "--message", "m"])
        self.assertEqual(res.code, 0, res.err)
        path = os.path.join(d, "incidents.jsonl")
        with open(path) as f:
            good = json.loads(f.readline())
        fault = dict(good, detector="nonfinite", **{"class": "numerical"})
        for k in ("decision", "restart", "exit_code", "exclude", "resume_from", "next_job"):
            fault.pop(k)
        for rec, needle in [(dict(good, step=1e30), "'step' is 1e+30, not an integer"),
                            (dict(good, step=2 ** 70), "'step' is 1.1805916207174113e+21, not an integer"),
                            (dict(good, rank=2 ** 40), "'rank' is 1099511627776, not an integer in"),
                            (dict(fault, step=0), "'step' is 0, not a step (1-based) a detector fired at"),
                            (dict(fault, step=-5), "'step' is -5")]:
            with self.subTest(rec=needle):
                with open(path, "w") as f:
                    f.write(json.dumps(rec) + "\n")
                res = self.report(d, "--field", "incident.step")
                self.assertEqual(res.code, EXIT_DAMAGED, res.out + res.err)
                self.assertIn("incidents.jsonl' line 1 is not an incident record: " + needle, res.err)
                self.assertEqual(res.out, "")  # no value printed (1e30 was INT64_MIN)
        # A fault at step 0 sends no bisection anywhere: damaged-record (4), not bad input.
        b = run(["bisect", "--run-dir", d], world=2, use_mpirun=True)
        self.assertEqual(b.code, EXIT_DAMAGED, b.out + b.err)
        self.assertIn("damaged-record", b.out)

    def test_log_refuses_control_characters(self):
        d = self.path("r")
        self.train("r", ARGS[:2] + ["--steps", "2", "--checkpoint-every", "2"])
        for opt in ("--host", "--exclude", "--resume-from", "--next-job"):
            with self.subTest(opt=opt):
                res = run(["log", d, "--decision", "stop", opt, "node1\ntime=forged step=1 detector=jobs"])
                self.assertEqual(res.code, EXIT_USAGE, res.err)
                self.assertIn("option '%s' holds a control character (a newline)" % opt, res.err)
                self.assertFalse(os.path.exists(os.path.join(d, "incidents.log")))
        res = run(["log", d, "--decision", "stop", "--message", "two\nlines\x1b[2J"])
        self.assertEqual(res.code, 0, res.err)
        with open(os.path.join(d, "incidents.log")) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertNotIn("\x1b", lines[0])

    def test_bad_input_damage_and_newer_versions(self):
        d = self.path("r")
        self.train("r", ARGS)
        empty = self.path("empty")
        os.makedirs(empty)
        for args, code, needle in [
                ([d, "--field", "diagnosis.verdict"], EXIT_USAGE, "diagnosis.json' does not exist"),
                ([d, "--field", "incident.host"], EXIT_USAGE, "holds no incident"),
                ([d, "--field", "incident.host", "--detector", "telepathy"], EXIT_USAGE, "unknown detector 'telepathy'"),
                ([d, "--field", "weather.today"], EXIT_USAGE, "the record is diagnosis, incident, audit or screen"),
                ([self.path("nope"), "--field", "diagnosis.verdict"], EXIT_USAGE, "is not a run directory"),
                ([], EXIT_USAGE, "report takes one path")]:
            with self.subTest(args=args):
                res = self.report(*args)
                self.assertEqual(res.code, code, res.out + res.err)
                self.assertEqual(res.err.count("culprit: error: "), 1, res.err)
                self.assertIn(needle, res.err)
        for args, needle in [([d], "option '--decision' is required"),
                             ([d, "--decision", "maybe"], "unknown decision 'maybe' (valid: done, stop, requeue, postmortem)"),
                             ([self.path("nope"), "--decision", "done"], "is not a run directory")]:
            res = run(["log"] + args)
            self.assertEqual(res.code, EXIT_USAGE, res.err)
            self.assertIn(needle, res.err)
        self.assertFalse(os.path.exists(os.path.join(self.path("nope"))))  # nothing created elsewhere
        # A record cut short, a record of another kind, a newer version, a vocabulary value unknown.
        path = os.path.join(d, "diagnosis.json")
        for text, needle in [('{"record": "diagnosis", "version": 1, "verdict"', "is not a culprit diagnosis record"),
                             ('{"record": "audit", "version": 1}', "not a culprit diagnosis record"),
                             ('{"record": "diagnosis", "version": 7}', "version 7; this culprit reads diagnosis records up to 2"),
                             (json.dumps({"record": "diagnosis", "version": 1, "verdict": "gremlins"}), "'verdict' is 'gremlins'")]:
            with self.subTest(text=text):
                with open(path, "w") as f:
                    f.write(text)
                res = self.report(d, "--field", "diagnosis.verdict")
                self.assertEqual(res.code, EXIT_DAMAGED, res.err)
                self.assertIn(needle, res.err)
        with open(os.path.join(d, "incidents.jsonl"), "w") as f:
            f.write('{"record": "incident", "version": 1, "step": 3}\n{"step": \n')
        res = self.report(d, "--field", "incident.step")
        self.assertEqual(res.code, EXIT_DAMAGED, res.err)
        self.assertIn("incidents.jsonl' line 1 is not an incident record", res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
