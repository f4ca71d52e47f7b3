"""The feistel epoch order (docs/determinism.md, "1. Data order") written again from the doc, in plain
Python ints, so the C++ (harness/src/order.cpp) can be checked against it bit for bit."""

MASK64 = (1 << 64) - 1
STREAM_SHUFFLE = 4
ROUNDS = 8
MAX_N = 1 << 62


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def key(seed, stream, a, b):
    return splitmix64((splitmix64((splitmix64((seed ^ stream) & MASK64) + a) & MASK64) + b) & MASK64)


class FeistelOrder:
    def __init__(self, seed, epoch, n):
        if not 1 <= n <= MAX_N:
            raise ValueError("n must be in [1, 2^62], got %d" % n)
        if epoch < 0:
            raise ValueError("epoch must be >= 0, got %d" % epoch)
        self.n = n
        self.h = 1
        while 4 ** self.h < n:
            self.h += 1
        self.mask = (1 << self.h) - 1
        self.keys = [key(seed & MASK64, STREAM_SHUFFLE, epoch, r) for r in range(ROUNDS)]
        self.passes = 0  # network applications so far, for the cost checks

    def _f(self, r, half):
        return splitmix64(half ^ self.keys[r]) & self.mask

    def encrypt(self, x):
        left, right = x >> self.h, x & self.mask
        for r in range(ROUNDS):
            left, right = right, left ^ self._f(r, right)
        return (left << self.h) | right

    def decrypt(self, x):
        left, right = x >> self.h, x & self.mask
        for r in reversed(range(ROUNDS)):
            left, right = right ^ self._f(r, left), left
        return (left << self.h) | right

    def _walk(self, x, step):
        if not 0 <= x < self.n:
            raise IndexError("%d outside [0, %d)" % (x, self.n))
        while True:
            x = step(x)
            self.passes += 1
            if x < self.n:
                return x

    def sample_at(self, position):
        return self._walk(position, self.encrypt)

    def position_of(self, sample):
        return self._walk(sample, self.decrypt)
