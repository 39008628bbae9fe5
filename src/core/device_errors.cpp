#include <string>

#include "attnkit/device.h"

namespace attnkit {

std::string DeviceErrors::describe() const {
  if (!any()) return "none";
  std::string s;
  if (faults > 0)
    s = std::to_string(faults) + " kernel violation" + (faults > 1 ? "s" : "") + ", the first: " + first +
        " (request " + std::to_string(request) + ", value " + std::to_string(value) + ")";
  if (dropped_kv_tokens > 0) {
    if (!s.empty()) s += "; ";
    s += "write_kv dropped " + std::to_string(dropped_kv_tokens) + " token" + (dropped_kv_tokens > 1 ? "s" : "") +
         " with a slot outside the cache";
  }
  return s;
}

}  // namespace attnkit
