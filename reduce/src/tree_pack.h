// The phase-1 message of the tree reduction, shared by tree_allreduce (the whole buffer at once)
// and OverlappedReduce (a bucket at a time): tree_allreduce is the one-bucket case [0, n), so both
// build and corrupt the same bytes. Internal to tree_reduce.cpp and tree_overlap.cpp.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "culprit/tree_reduce.h"

namespace culprit::tree_detail {

// [a, b): the part of chunk c (of n elements over W ranks) inside [lo, hi).
struct Piece {
  std::size_t a = 0, b = 0;
  std::size_t len() const { return b - a; }
};
inline Piece piece(std::size_t n, int W, int c, std::size_t lo, std::size_t hi) {
  const std::size_t a = std::max(chunk_offset(n, W, c), lo), b = std::min(chunk_offset(n, W, c + 1), hi);
  return a < b ? Piece{a, b} : Piece{a, a};
}

// This rank's phase-1 message for [lo, hi): for each chunk owner c, every block's piece of chunk c,
// blocks in tree order. One block and no faulty link: the pieces are sent from where they are.
struct Outgoing {
  const float* buf = nullptr;
  std::vector<int> count, displ;
};
inline Outgoing pack(const std::vector<const float*>& blocks, std::size_t n, int W, std::size_t lo, std::size_t hi,
                     bool in_place, std::vector<float>* packed) {
  Outgoing o;
  o.count.assign(W, 0);
  o.displ.assign(W, 0);
  if (in_place) {
    o.buf = blocks[0] + lo;
    for (int c = 0; c < W; ++c) {
      const Piece p = piece(n, W, c, lo, hi);
      o.displ[c] = static_cast<int>(p.a - lo);
      o.count[c] = static_cast<int>(p.len());
    }
    return o;
  }
  packed->resize((hi - lo) * blocks.size());
  std::size_t pos = 0;
  for (int c = 0; c < W; ++c) {
    const Piece p = piece(n, W, c, lo, hi);
    o.displ[c] = static_cast<int>(pos);
    o.count[c] = static_cast<int>(p.len() * blocks.size());
    for (const float* blk : blocks) {
      std::memcpy(packed->data() + pos, blk + p.a, p.len() * sizeof(float));
      pos += p.len();
    }
  }
  o.buf = packed->data();
  return o;
}

// A faulty link: element fault.offset of every block's piece this rank sends, after the sender
// fingerprinted it (the message as meant). Nothing when the offset is outside [lo, hi).
inline void corrupt_outgoing(const SendFault& fault, std::size_t n, int W, std::size_t lo, std::size_t hi,
                             std::size_t nblocks, const Outgoing& o, std::vector<float>* packed) {
  if (fault.offset < lo || fault.offset >= hi) return;
  int c = 0;
  while (chunk_offset(n, W, c + 1) <= fault.offset) ++c;
  const Piece p = piece(n, W, c, lo, hi);
  for (std::size_t j = 0; j < nblocks; ++j) {
    float& v = (*packed)[o.displ[c] + j * p.len() + (fault.offset - p.a)];
    v = fault.apply(fault.ctx, v);
  }
}

// Adds the time of f to check->seconds (the communication check's share of detector_seconds).
template <class F>
void timed(CommCheck* check, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  check->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace culprit::tree_detail
