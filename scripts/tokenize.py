#!/usr/bin/env python3
"""Tokenises a small corpus that ships with the repository into a token file for `--data tokens:PATH`.

    scripts/tokenize.py OUT [--vocab 512] [--seq-len 64] [--dtype uint16|uint32] [FILE ...]

The corpus is README.md and docs/*.md of this repository (or the FILEs given), read as bytes and
concatenated in sorted order of their paths relative to the repository root (byte order: README.md
comes before docs/...). Nothing is downloaded and no third-party tokenizer is used: the script trains
a byte-level BPE on the corpus itself and encodes the corpus with it.

The tokenizer (deterministic: the same corpus gives the same file, byte for byte):
1. Pre-tokenisation: the bytes are split into chunks by the regular expression PATTERN below (words
   with their leading space, numbers, runs of other symbols, white space), as GPT-2 does; merges never
   cross a chunk's boundary, and the chunks concatenated are the corpus again.
2. Tokens 0..255 are the bytes. Each of the vocab - 256 merges joins the adjacent pair (a, b) of
   tokens that occurs most often in the corpus (occurrences counted over every chunk, by its
   frequency; inside a chunk, "a a a" holds the pair (a, a) twice: counted as a standard BPE counts
   pairs, overlaps included); a tie between pairs of equal count goes to the smallest (a, b) (a
   first, then b, as token numbers). The new token is number 256 + m for the m-th merge, and every
   occurrence of the pair in every chunk is replaced, left to right.
3. Encoding a chunk applies the merges in their order (the same as the training's last state).
Training stops early if no pair occurs twice (the vocabulary is then smaller than asked, and the
sidecar says so in "merges").

It writes OUT (token ids, little-endian uint16 by default) and OUT.json, the sidecar culprit reads:
{"dtype": "uint16", "vocab": V, "seq_len": T, "tokenizer": "...", "merges": N, "tokens": n,
 "corpus": [files], "corpus_bytes": b}. `--data tokens:OUT` then trains on floor((n - 1) / T) windows
(docs/data.md). It checks that decoding the tokens gives the corpus back.
"""
import argparse
import json
import os
import re
import sys

PATTERN = rb"""'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""
TOKENIZER = "byte-level BPE, scripts/tokenize.py v1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def corpus_files(root):
    names = ["README.md"] + ["docs/" + n for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md")]
    return sorted(n for n in names if os.path.isfile(os.path.join(root, n)))


def pairs_of(word):
    """Pair -> occurrences in one chunk (a token sequence)."""
    out = {}
    for p in zip(word, word[1:]):
        out[p] = out.get(p, 0) + 1
    return out


def merge_word(word, pair, new):
    a, b = pair
    out, i, n = [], 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def train(chunks, vocab):
    """chunks: {bytes: frequency}. Returns (merges, {chunk: its token tuple after training})."""
    words = [tuple(c) for c in chunks]
    freq = [chunks[c] for c in chunks]
    counts = {}   # pair -> occurrences in the corpus
    where = {}    # pair -> ids of the words holding it
    for w, word in enumerate(words):
        for p, c in pairs_of(word).items():
            counts[p] = counts.get(p, 0) + c * freq[w]
            where.setdefault(p, set()).add(w)
    merges = []
    while 256 + len(merges) < vocab and counts:
        # Most frequent; ties to the smallest pair.
        best = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < 2:
            break
        pair, new = best[0], 256 + len(merges)
        merges.append(pair)
        for w in sorted(where.pop(pair, ())):
            old = words[w]
            for p, c in pairs_of(old).items():
                counts[p] -= c * freq[w]
                if counts[p] == 0:
                    del counts[p]
                if p in where and p != pair:
                    where[p].discard(w)
            words[w] = merge_word(old, pair, new)
            for p, c in pairs_of(words[w]).items():
                counts[p] = counts.get(p, 0) + c * freq[w]
                where.setdefault(p, set()).add(w)
        counts.pop(pair, None)
    return merges, dict(zip(chunks, words))


def encode_chunk(chunk, merges):
    word = tuple(chunk)
    for m, pair in enumerate(merges):
        if len(word) < 2:
            break
        word = merge_word(word, pair, 256 + m)
    return word


def decode(tokens, merges):
    table = [bytes([i]) for i in range(256)]
    for a, b in merges:
        table.append(table[a] + table[b])
    return b"".join(table[t] for t in tokens)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the token file to write (and OUT.json beside it)")
    p.add_argument("files", nargs="*", help="corpus files (default: README.md and docs/*.md of this repository)")
    p.add_argument("--vocab", type=int, default=512, help="vocabulary size: 256 bytes + merges (default 512)")
    p.add_argument("--seq-len", type=int, default=64, help="seq_len written to the sidecar (default 64)")
    p.add_argument("--dtype", choices=["uint16", "uint32"], default="uint16")
    a = p.parse_args()
    if a.vocab < 256 or (a.dtype == "uint16" and a.vocab > 65536):
        sys.exit("tokenize.py: --vocab must be at least 256 (and at most 65536 for uint16)")
    if a.seq_len < 1:
        sys.exit("tokenize.py: --seq-len must be at least 1")
    if a.files:
        names = sorted(a.files)
        paths = names
    else:
        names = corpus_files(ROOT)
        paths = [os.path.join(ROOT, n) for n in names]
    corpus = b"".join(open(path, "rb").read() for path in paths)
    pieces = re.findall(PATTERN, corpus)
    if b"".join(pieces) != corpus:
        sys.exit("tokenize.py: the pre-tokeniser lost bytes (a bug)")
    chunks = {}
    for c in pieces:
        chunks[c] = chunks.get(c, 0) + 1
    merges, encoded = train(chunks, a.vocab)
    tokens = [t for c in pieces for t in encoded[c]]
    if decode(tokens, merges) != corpus:
        sys.exit("tokenize.py: decoding the tokens does not give the corpus back (a bug)")
    sample = pieces[: 200]
    if any(encode_chunk(c, merges) != encoded[c] for c in sample):
        sys.exit("tokenize.py: encoding disagrees with training (a bug)")
    if len(tokens) < a.seq_len + 1:
        sys.exit("tokenize.py: the corpus gives %d tokens: too few for one window of %d" % (len(tokens), a.seq_len + 1))
    import array
    arr = array.array("H" if a.dtype == "uint16" else "I", tokens)
    if arr.itemsize != (2 if a.dtype == "uint16" else 4):
        sys.exit("tokenize.py: this Python's array item sizes are unusual")
    if sys.byteorder != "little":
        arr.byteswap()
    out_dir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(a.out, "wb") as f:
        f.write(arr.tobytes())
    meta = {"dtype": a.dtype, "vocab": a.vocab, "seq_len": a.seq_len, "tokenizer": TOKENIZER,
            "merges": len(merges), "tokens": len(tokens), "corpus": names, "corpus_bytes": len(corpus)}
    with open(a.out + ".json", "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print("tokenize.py: %d bytes of %d files -> %d tokens (%d merges, vocab %d), %d windows of %d: %s" %
          (len(corpus), len(names), len(tokens), len(merges), a.vocab, (len(tokens) - 1) // a.seq_len, a.seq_len,
           a.out))


if __name__ == "__main__":
    main()
