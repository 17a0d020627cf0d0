// A libjpeg error manager for the test-only bindings (test_encoder.cpp): an error
// formats its message and jumps back to the caller's setjmp, which raises it. (The library's own
// decoder, core/decoder.cpp, counts warnings and throws DecodeError: it has its own.)
#pragma once
#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>

namespace fastdata::bindings {

struct JumpError {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

// libjpeg's error_exit for a JumpError: never returns.
inline void jump_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JumpError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

}  // namespace fastdata::bindings
