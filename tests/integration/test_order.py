"""The feistel epoch order: C++ (harness/src/order.cpp, through culprit_order_dump) and the Python written
from docs/determinism.md (feistel.py) give the same samples and positions bit for bit.

The dump program is $CULPRIT_ORDER_DUMP (ctest sets it), or the first argument, or
build/tests/culprit_order_dump."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from feistel import MAX_N, FeistelOrder  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DUMP = os.environ.get("CULPRIT_ORDER_DUMP", os.path.join(ROOT, "build", "tests", "culprit_order_dump"))
if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
    DUMP = sys.argv.pop(1)

U64_MAX = (1 << 64) - 1

# (seed, epoch, N, first, count): N = 1, small N, N not a power of two, a power of four, large N.
CASES = [(1234, 0, 1, 0, 1), (0, 5, 1, 0, 1)]
CASES += [(1234, e, n, 0, n) for e in (0, 1, 2) for n in (2, 3, 4, 5, 7, 16, 17, 100, 1000)]
CASES += [
    (0, 0, 3000, 0, 3000),
    (U64_MAX, 5, 2999, 0, 2999),
    (1234, 7, (1 << 20) + 12345, 0, 1000),
    (1234, 7, (1 << 20) + 12345, (1 << 20) + 11345, 1000),
    (1234, 0, 4 ** 10, 0, 1000),
    (0, 0, 10 ** 12, 0, 1000),
    (42, 3, 3 * 10 ** 9 + 7, 0, 1000),
    (1234, 0, (1 << 40) + 3, 0, 1000),
    (U64_MAX, 3, (1 << 40) + 3, 0, 1000),
    (99, 12345, (1 << 40) + 3, 0, 1000),
    (5, 1, MAX_N, 0, 1000),
    (5, 1, MAX_N, MAX_N - 1000, 1000),
]


def dump(seed, epoch, n, first, count, mode="sample"):
    res = subprocess.run([DUMP, str(seed), str(epoch), str(n), str(first), str(count), mode],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise AssertionError("%s failed (%d): %s" % (DUMP, res.returncode, res.stderr))
    return [int(line) for line in res.stdout.split()]


class CppEqualsPython(unittest.TestCase):
    def test_samples(self):
        for seed, epoch, n, first, count in CASES:
            with self.subTest(seed=seed, epoch=epoch, n=n, first=first):
                order = FeistelOrder(seed, epoch, n)
                self.assertEqual(dump(seed, epoch, n, first, count),
                                 [order.sample_at(p) for p in range(first, first + count)])

    def test_positions(self):
        for seed, epoch, n, first, count in CASES:
            with self.subTest(seed=seed, epoch=epoch, n=n, first=first):
                order = FeistelOrder(seed, epoch, n)
                self.assertEqual(dump(seed, epoch, n, first, count, "position"),
                                 [order.position_of(s) for s in range(first, first + count)])

    def test_known_values(self):
        # Pinned: a change here changes every feistel run's data order.
        self.assertEqual(dump(1234, 0, 10, 0, 10), [2, 1, 4, 6, 8, 5, 3, 7, 9, 0])
        self.assertEqual(dump(U64_MAX, 3, (1 << 40) + 3, 0, 3), [340959048080, 868096139855, 1000721408572])

    def test_dump_refuses_what_the_order_refuses(self):
        for args in (["1", "0", "0", "0", "1"], ["1", "-1", "10", "0", "1"], ["1", "0", str(MAX_N + 1), "0", "1"],
                     ["1", "0", "10", "10", "1"], ["1", "0", "10", "-1", "1"]):
            res = subprocess.run([DUMP] + args, capture_output=True, text=True, timeout=60)
            self.assertEqual(res.returncode, 2, args)
            self.assertIn("culprit_order_dump:", res.stderr, args)
        for n, epoch in ((0, 0), (10, -1), (MAX_N + 1, 0)):
            self.assertRaises(ValueError, FeistelOrder, 1, epoch, n)
        self.assertRaises(IndexError, FeistelOrder(1, 0, 10).sample_at, 10)


class PythonContract(unittest.TestCase):
    """The doc's own claims, checked on the Python side: a permutation, and the cost."""

    def test_permutation_and_inverse(self):
        for n in range(1, 130):
            order = FeistelOrder(77, 2, n)
            samples = [order.sample_at(p) for p in range(n)]
            self.assertEqual(sorted(samples), list(range(n)), n)
            self.assertEqual([order.position_of(s) for s in samples], list(range(n)), n)

    def test_domain_under_4n_and_an_epoch_costs_at_most_the_domain(self):
        # Cycle walking passes every domain value at most once per epoch, so an epoch's network
        # applications are at most 4^h <= 4N (4^h < 4N for N > 1).
        for n in list(range(1, 300)) + [1000, 4 ** 5, 4 ** 5 + 1, 3000]:
            order = FeistelOrder(3, 1, n)
            self.assertLessEqual(4 ** order.h, 4 * n, n)
            self.assertTrue(order.h == 1 or 4 ** (order.h - 1) < n, n)
            for p in range(n):
                order.sample_at(p)
            self.assertGreaterEqual(order.passes, n)
            self.assertLessEqual(order.passes, 4 ** order.h, n)

    def test_mean_cost_at_large_n(self):
        # N = 2^40 + 3 has the worst ratio: domain 2^42, just under 4N; the mean walk is about 4.
        order = FeistelOrder(1234, 0, (1 << 40) + 3)
        for p in range(1000):
            order.sample_at(p)
        self.assertLess(order.passes / 1000, 5.0)


if __name__ == "__main__":
    if not os.path.exists(DUMP):
        raise SystemExit("culprit_order_dump %s is missing (build the target culprit_order_dump)" % DUMP)
    unittest.main(verbosity=2)
