#include "culprit/fingerprint.h"

#include <xxhash.h>
// XXH3 through libxxhash's runtime dispatch (AVX-512, AVX2 or SSE2, whichever the CPU has): the same
// hashes (XXH3 is defined independently of the vector width), about half the time of the SSE2
// baseline Debian builds the plain entry points for — and hashing was a fifth of a step (issue 35,
// docs/performance.md).
#ifdef CULPRIT_XXH3_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace culprit {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kUInt8: return "uint8";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kFloat64: case DType::kInt64: return 8;
    case DType::kBFloat16: case DType::kFloat16: return 2;
    case DType::kUInt8: case DType::kBool: return 1;
  }
  return 0;
}

namespace {
void put_le64(unsigned char* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

// fp1's last step: chunk hashes, as little-endian uint64, through a small on-stack batch into one
// streaming XXH3-64 digest (no allocation per fingerprint).
template <class HashOf>
Fingerprint combine(std::size_t nchunks, HashOf&& hash_of) {
  if (nchunks == 0) return XXH3_64bits(nullptr, 0);
  XXH3_state_t* st = XXH3_createState();
  if (!st) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  unsigned char batch[8 * 64];
  std::size_t in_batch = 0;
  for (std::size_t c = 0; c < nchunks; ++c) {
    put_le64(batch + 8 * in_batch, hash_of(c));
    if (++in_batch == 64) {
      XXH3_64bits_update(st, batch, sizeof batch);
      in_batch = 0;
    }
  }
  if (in_batch) XXH3_64bits_update(st, batch, 8 * in_batch);
  const Fingerprint fp = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return fp;
}

}  // namespace

Fingerprint fingerprint_bytes(const void* data, std::size_t nbytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t nchunks = (nbytes + kFingerprintChunkBytes - 1) / kFingerprintChunkBytes;
  return combine(nchunks, [&](std::size_t c) {
    const std::size_t off = c * kFingerprintChunkBytes;
    return XXH3_64bits(p + off, std::min(kFingerprintChunkBytes, nbytes - off));
  });
}

Fingerprint fingerprint_with_parts(const void* data, std::size_t nbytes, const std::vector<std::size_t>& offsets,
                                   const std::vector<std::size_t>& sizes, std::vector<Fingerprint>* parts) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t C = kFingerprintChunkBytes, nchunks = (nbytes + C - 1) / C;
  std::vector<std::uint64_t> whole(nchunks), mine;
  parts->assign(offsets.size(), 0);
  std::size_t part = 0, next = 0;  // the part being hashed, and its next chunk's offset in it
  // Every chunk of the parts that ends by `end`: they lie in the last two whole chunks (in cache).
  auto parts_until = [&](std::size_t end) {
    for (; part < offsets.size(); ++part, next = 0) {
      const std::size_t size = sizes[part];
      for (; next < size && offsets[part] + std::min(next + C, size) <= end; next += C)
        mine.push_back(XXH3_64bits(p + offsets[part] + next, std::min(C, size - next)));
      if (next < size) return;  // its next chunk ends past `end`
      (*parts)[part] = combine_chunk_hashes(mine.data(), mine.size());
      mine.clear();
    }
  };
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * C, len = std::min(C, nbytes - off);
    whole[c] = XXH3_64bits(p + off, len);
    parts_until(off + len);
  }
  parts_until(nbytes);  // zero-length parts at the end
  return combine_chunk_hashes(whole.data(), whole.size());
}

std::uint64_t chunk_hash(const void* data, std::size_t nbytes) { return XXH3_64bits(data, nbytes); }

Fingerprint combine_chunk_hashes(const std::uint64_t* hashes, std::size_t nchunks) {
  return combine(nchunks, [&](std::size_t c) { return hashes[c]; });
}

std::string fingerprint_hex(Fingerprint fp) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fp));
  return buf;
}

FingerprintSet::FingerprintSet() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

FingerprintSet::~FingerprintSet() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void FingerprintSet::add(const std::string& name, DType dtype,
                         const std::vector<std::int64_t>& shape, Fingerprint data_fp) {
  auto* st = static_cast<XXH3_state_t*>(state_);
  std::vector<unsigned char> rec(4 + name.size() + 2 + 8 * shape.size() + 8);
  unsigned char* q = rec.data();
  const auto n = static_cast<std::uint32_t>(name.size());
  for (int i = 0; i < 4; ++i) *q++ = static_cast<unsigned char>(n >> (8 * i));
  std::memcpy(q, name.data(), name.size());
  q += name.size();
  *q++ = static_cast<unsigned char>(dtype);
  *q++ = static_cast<unsigned char>(shape.size());
  for (std::int64_t d : shape) {
    put_le64(q, static_cast<std::uint64_t>(d));
    q += 8;
  }
  put_le64(q, data_fp);
  XXH3_64bits_update(st, rec.data(), rec.size());
}

Fingerprint FingerprintSet::finish() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

}  // namespace culprit
