#include "cli/flags.h"

#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <string_view>

namespace attnkit::cli {

namespace {

[[noreturn]] void bad(std::string_view flag, std::string_view value, std::string_view rule) {
  throw UsageError(std::string(flag) + ": '" + std::string(value) + "' " + std::string(rule));
}

int64_t parse_int(std::string_view flag, std::string_view s, int64_t min) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) bad(flag, s, "is not an integer");
  if (v < min) bad(flag, s, "must be >= " + std::to_string(min));
  if (v > INT32_MAX) bad(flag, s, "is too large");
  return v;
}

float parse_positive_float(std::string_view flag, std::string_view s) {
  std::string str(s);
  size_t used = 0;
  float v = 0.f;
  try {
    v = std::stof(str, &used);
  } catch (const std::exception&) {
    bad(flag, s, "is not a number");
  }
  if (used != str.size()) bad(flag, s, "is not a number");
  if (!(v > 0.f) || !std::isfinite(v)) bad(flag, s, "must be a finite number > 0");
  return v;
}

DType parse_model_dtype(std::string_view s) {
  static const std::map<std::string_view, DType> names = {
      {"bf16", DType::bf16}, {"fp16", DType::f16}, {"fp32", DType::f32}};
  auto it = names.find(s);
  if (it == names.end()) bad("--dtype", s, "must be bf16, fp16 or fp32");
  return it->second;
}

// nullopt = auto (the model dtype)
std::optional<DType> parse_cache_dtype(std::string_view s) {
  static const std::map<std::string_view, DType> names = {
      {"fp8", DType::fp8_e4m3}, {"fp8_e4m3", DType::fp8_e4m3}, {"fp8_e5m2", DType::fp8_e5m2},
      {"nvfp4", DType::nvfp4},  {"bf16", DType::bf16},         {"fp16", DType::f16},
      {"fp32", DType::f32}};
  if (s == "auto") return std::nullopt;
  auto it = names.find(s);
  if (it == names.end())
    bad("--kv-cache-dtype", s, "must be auto, fp8, fp8_e4m3, fp8_e5m2, nvfp4, bf16, fp16 or fp32");
  return it->second;
}

DeviceSpec parse_device(std::string_view s) {
  if (s == "cpu") return DeviceSpec::Cpu();
  if (s.size() >= 4 && s.size() <= 5 && s.substr(0, 2) == "sm") {
    int cc = 0;
    auto digits = s.substr(2);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), cc);
    if (ec == std::errc() && end == digits.data() + digits.size() && cc >= 10)
      return DeviceSpec::Cuda(cc / 10, cc % 10);
  }
  bad("--device", s, "must be cpu or a CUDA compute capability such as sm80, sm89, sm90, sm100");
}

KVLayout parse_layout_flag(std::string_view s) {
  if (s == "NHD" || s == "nhd") return KVLayout::NHD;
  if (s == "HND" || s == "hnd") return KVLayout::HND;
  bad("--layout", s, "must be NHD or HND");
}

}  // namespace

ConfigFlags parse_config_flags(int argc, char** argv, FlagRequirements need) {
  static const std::set<std::string_view> valued = {
      "--heads", "--kv-heads", "--head-size", "--dtype", "--kv-cache-dtype", "--block-size",
      "--layout", "--device", "--num-sms", "--softcap", "--sliding-window", "--backend", "--num-blocks"};
  static const std::set<std::string_view> switches = {"--alibi", "--sinks", "--non-causal", "--lse"};
  ConfigFlags f;
  std::map<std::string_view, std::string_view> seen;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      f.help = true;
      return f;
    }
    std::string_view name = arg, value;
    const auto eq = arg.find('=');
    const bool inline_value = arg.substr(0, 2) == "--" && eq != std::string_view::npos;
    if (inline_value) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (name == "--num-blocks" && !need.num_blocks) throw UsageError("unknown flag '--num-blocks' for this command");
    if (switches.count(name)) {
      if (inline_value) throw UsageError(std::string(name) + " takes no value");
      seen[name] = "";
      continue;
    }
    if (!valued.count(name)) throw UsageError("unknown flag '" + std::string(arg) + "' (see --help)");
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError(std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (seen.count(name)) throw UsageError(std::string(name) + " is given twice");
    seen[name] = value;
  }
  auto has = [&](std::string_view n) { return seen.count(n) > 0; };
  auto require = [&](std::string_view n) {
    if (!has(n)) throw UsageError("missing required flag " + std::string(n) + " (see --help)");
  };
  require("--heads");
  require("--head-size");
  if (need.device) require("--device");
  if (need.backend) require("--backend");
  if (need.num_blocks) require("--num-blocks");

  AttentionConfig& c = f.cfg;
  c.num_heads = static_cast<int>(parse_int("--heads", seen["--heads"], 1));
  c.num_kv_heads = has("--kv-heads") ? static_cast<int>(parse_int("--kv-heads", seen["--kv-heads"], 1)) : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    throw UsageError("--heads " + std::to_string(c.num_heads) + " is not a multiple of --kv-heads " +
                     std::to_string(c.num_kv_heads) + " (each KV head serves a whole group of query heads)");
  c.head_size = static_cast<int>(parse_int("--head-size", seen["--head-size"], 1));
  c.dtype = has("--dtype") ? parse_model_dtype(seen["--dtype"]) : DType::bf16;
  const auto cache = has("--kv-cache-dtype") ? parse_cache_dtype(seen["--kv-cache-dtype"]) : std::nullopt;
  c.cache_dtype = cache.value_or(c.dtype);
  c.block_size = has("--block-size") ? static_cast<int>(parse_int("--block-size", seen["--block-size"], 1)) : 16;
  c.layout = has("--layout") ? parse_layout_flag(seen["--layout"]) : KVLayout::NHD;
  c.device = has("--device") ? parse_device(seen["--device"]) : DeviceSpec::Cuda(9, 0);
  if (has("--num-sms")) {
    if (c.device.cpu) throw UsageError("--num-sms: a CPU device has no SMs");
    c.device.num_sms = static_cast<int>(parse_int("--num-sms", seen["--num-sms"], 1));
  }
  c.features.alibi = has("--alibi");
  c.features.sinks = has("--sinks");
  c.features.non_causal = has("--non-causal");
  c.features.lse = has("--lse");
  if (has("--softcap")) {
    f.softcap = parse_positive_float("--softcap", seen["--softcap"]);
    c.features.softcap = true;
  }
  if (has("--sliding-window")) {
    f.sliding_window = static_cast<int>(parse_int("--sliding-window", seen["--sliding-window"], 1));
    c.features.sliding_window = true;
  }
  if (has("--backend")) {
    const std::string name(seen["--backend"]);
    std::string known;
    bool found = false;
    for (const AttentionBackend* b : backends()) {
      found = found || b->name() == name;
      known += (known.empty() ? "" : ", ") + std::string(b->name());
    }
    if (!found) bad("--backend", name, "is not a backend (one of " + known + ")");
    f.backend = name;
  }
  if (need.num_blocks) f.num_blocks = parse_int("--num-blocks", seen["--num-blocks"], 1);
  return f;
}

std::string config_flags_help(FlagRequirements need) {
  std::string h;
  h += "  --heads N               query heads (required)\n";
  h += "  --kv-heads N            KV heads (default: --heads); --heads must be a multiple\n";
  h += "  --head-size N           head size (required)\n";
  h += "  --dtype T               bf16 | fp16 | fp32 (default bf16)\n";
  h += "  --kv-cache-dtype T      auto | fp8 | fp8_e4m3 | fp8_e5m2 | nvfp4 | bf16 | fp16 | fp32\n";
  h += "                          (default auto = --dtype; fp8 = fp8_e4m3)\n";
  h += "  --block-size N          tokens per KV cache block (default 16)\n";
  h += "  --layout L              NHD | HND (default NHD)\n";
  h += std::string("  --device D              cpu | sm80 | sm89 | sm90 | sm100 (any smNN)") +
       (need.device ? " (required)\n" : " (default sm90)\n");
  h += "  --num-sms N             SMs of the GPU (default: the usual count for the device)\n";
  h += "  --alibi                 the model uses ALiBi\n";
  h += "  --sinks                 the model uses attention sinks\n";
  h += "  --softcap X             logit softcap X > 0\n";
  h += "  --sliding-window N      sliding window of N tokens\n";
  h += "  --non-causal            non-causal (bidirectional) attention\n";
  h += "  --lse                   the caller needs the LSE output\n";
  h += std::string("  --backend NAME          ") +
       (need.backend ? "the backend (required): " : "preferred backend (error if it cannot serve): ");
  std::string names;
  for (const AttentionBackend* b : backends()) names += (names.empty() ? "" : ", ") + std::string(b->name());
  h += names + "\n";
  if (need.num_blocks) h += "  --num-blocks N          blocks in the KV cache (required)\n";
  h += "  --help                  this text\n";
  return h;
}

}  // namespace attnkit::cli
