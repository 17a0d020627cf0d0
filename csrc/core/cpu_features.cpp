#include "core/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace fastdata {

bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

bool simd_allowed() {
  static const bool allowed = !env_switch("FASTDATA_FORCE_SCALAR");
  return allowed;
}

bool bmi2_allowed() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool allowed = simd_allowed() && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                              __builtin_cpu_supports("popcnt");
  return allowed;
#else
  return false;
#endif
}

bool fast_bit_deposit() {
  static const bool fast = [] {
#if defined(__x86_64__) || defined(_M_X64)
    if (!bmi2_allowed()) return false;
    if (env_switch("FASTDATA_SOFTWARE_BIT_DEPOSIT")) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const unsigned base = (eax >> 8) & 0xF;  // the family, extended when the base one is 0xF
    const unsigned family = base == 0xF ? base + ((eax >> 20) & 0xFF) : base;
    const bool amd_like = std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;
    return !(amd_like && family == 0x17);
#else
    return false;
#endif
  }();
  return fast;
}

bool avx2_allowed() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool allowed = simd_allowed() && __builtin_cpu_supports("avx2");
  return allowed;
#else
  return false;
#endif
}

bool avx2_f16c_allowed() {
  static const bool allowed = [] {
#if defined(__x86_64__) || defined(_M_X64)
    // F16C by CPUID (leaf 1, ECX): clang's __builtin_cpu_supports does not know "f16c"; its OS
    // support is AVX's (the YMM state), which the avx2 check covers.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!avx2_allowed() || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return (ecx & bit_F16C) != 0;
#else
    return false;
#endif
  }();
  return allowed;
}

}  // namespace fastdata
