#include "core/cpu_features.h"

#include <cstdlib>

namespace fastdata {

bool simd_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("FASTDATA_FORCE_SCALAR");
    return v == nullptr || v[0] == '\0' || v[0] == '0';
  }();
  return allowed;
}

}  // namespace fastdata
