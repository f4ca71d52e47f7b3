// The two formats `culprit export` writes. torch's is libtorch's own writer; safetensors is written
// here (a JSON header and raw bytes: no dependency beyond nlohmann-json).
#include "export/formats.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "culprit/tensors.h"

namespace culprit::harness {

namespace {

// safetensors' dtype names (its Dtype enum), for the dtypes a state dict holds.
const char* safetensors_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kDouble: return "F64";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: return nullptr;
  }
}

// A host tensor whose bytes are its elements in row-major order.
at::Tensor dense(const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); }

}  // namespace

// torch::pickle_save's steps, but for its Pickler's one default: pickle_save tags the dict with
// torch.jit._pickle.restore_type_tag (TorchScript's static type), a global that torch.load's
// weights_only unpickler refuses ("Weights only load failed"). Untagged, the pickle is a plain
// dict of _rebuild_tensor_v2 calls, as torch.save writes one.
Status encode_torch(const std::vector<NamedTensor>& tensors, std::string* out) {
  return guarded(StatusCode::kInternal, "writing the torch file", [&] {
    c10::Dict<std::string, at::Tensor> dict;
    for (const auto& t : tensors) dict.insert(t.name, t.tensor.detach().to(at::kCPU));
    std::string pickle;
    torch::jit::Pickler pickler([&](const char* b, std::size_t n) { pickle.append(b, n); }, nullptr, nullptr, nullptr,
                                nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(c10::IValue(dict));
    pickler.stop();
    out->clear();
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* b, std::size_t n) {
      out->append(static_cast<const char*>(b), n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), zip);
    zip.writeEndOfFile();
    return Status::OK();
  });
}

Status encode_safetensors(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata,
                          std::string* out) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const char* dtype = safetensors_dtype(t.tensor.scalar_type());
    if (!dtype)
      return Status::BadInput("tensor '" + t.name + "' is " + std::string(c10::toString(t.tensor.scalar_type())) +
                              ", which safetensors does not store (use --format torch)");
    if (t.name == "__metadata__" || header.contains(t.name))
      return Status::BadInput("tensor name '" + t.name + "' is " +
                              (t.name == "__metadata__" ? "safetensors' own key" : "given twice"));
    data.push_back(dense(t.tensor));
    const std::uint64_t bytes = data.back().numel() * data.back().element_size();
    header[t.name] = {{"dtype", dtype}, {"shape", t.tensor.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();  // strict UTF-8: a name that is not valid UTF-8 is refused, not mangled
  } catch (const nlohmann::json::exception& e) {
    return Status::BadInput(std::string("a tensor name cannot be written as JSON: ") + e.what());
  }
  // The data starts 8-byte aligned (as safetensors' own writer pads): readers may map it in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  out->clear();
  out->reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((std::uint64_t{text.size()} >> (8 * i)) & 0xff));
  *out += text;
  // safetensors is little-endian: the host's bytes are the file's.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors' bytes are little-endian");
  for (const auto& t : data)
    if (t.numel() > 0) out->append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return Status::OK();
}

}  // namespace culprit::harness
