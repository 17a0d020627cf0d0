/* A stand-in for libnvjpeg's hardware batched decode and the CUDA runtime's event calls, for
 * tests of fastdata's nvJPEG batch call (csrc/gpu/nvjpeg_batch.cpp) on a machine without a GPU.
 * It decodes with libjpeg into host memory at the destinations' addresses, so its pixels are
 * libjpeg's (the native engine's), and it checks how it is called:
 *   - a batch call whose rows include one libjpeg cannot decode fails whole, with
 *     NVJPEG_STATUS_BAD_JPEG, as nvJPEG fails a batch for one bad bitstream;
 *   - nvjpegDecodeBatchedInitialize while the previous call's work was not waited for (its event
 *     recorded and synchronized) is counted as a misuse ("early_reuse");
 *   - knobs (fake_nvjpeg_set) refuse a width, fail every batch call larger than N rows (a data
 *     status), return any status from every batch call, or report no hardware decoder;
 *   - counters (fake_nvjpeg_get) say what was called.
 * Built by tests/decoders/test_nvjpeg_batch.py with the system's libjpeg. Not part of fastdata. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
  unsigned char* channel[4];
  size_t pitch[4];
} Image;

typedef struct {
  int width, height, components, progressive, precision;
} Stream;

static int refuse_width = -1;      /* streams of this width: unsupported by the "hardware" */
static int fail_batches_over = 0;  /* >0: a batch call of more rows fails (JPEG_NOT_SUPPORTED) */
static int fail_status = 0;        /* !=0: every batch call returns this status */
static int engines = 5;
static int calls, rows_decoded, initializes, records, syncs, early_reuse, blocking_events, max_rows;
typedef struct {
  int rows; /* the batch size Initialize set */
  int busy; /* work of its last call not yet waited for */
} State;
static __thread State* last_called; /* the state this thread's last decode call used */

int fake_nvjpeg_set(const char* knob, int value) {
  if (!strcmp(knob, "refuse_width")) refuse_width = value;
  else if (!strcmp(knob, "fail_batches_over")) fail_batches_over = value;
  else if (!strcmp(knob, "fail_status")) fail_status = value;
  else if (!strcmp(knob, "engines")) engines = value;
  else if (!strcmp(knob, "reset")) {
    refuse_width = -1, fail_batches_over = 0, fail_status = 0, engines = 5;
    calls = rows_decoded = initializes = records = syncs = early_reuse = blocking_events = max_rows = 0;
  } else return -1;
  return 0;
}

int fake_nvjpeg_get(const char* name) {
  if (!strcmp(name, "calls")) return calls;
  if (!strcmp(name, "rows_decoded")) return rows_decoded;
  if (!strcmp(name, "initializes")) return initializes;
  if (!strcmp(name, "records")) return records;
  if (!strcmp(name, "syncs")) return syncs;
  if (!strcmp(name, "early_reuse")) return early_reuse;
  if (!strcmp(name, "blocking_events")) return blocking_events;
  if (!strcmp(name, "max_rows")) return max_rows;
  return -1;
}

typedef struct {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
} Errors;

static void on_error(j_common_ptr cinfo) { longjmp(((Errors*)cinfo->err)->jump, 1); }
static void quiet(j_common_ptr cinfo, int level) { (void)cinfo, (void)level; }

/* libjpeg's header read, or its full decode into out (pitch bytes a row) when out is set. */
static int run_libjpeg(const unsigned char* data, size_t size, Stream* info, unsigned char* out, size_t pitch) {
  struct jpeg_decompress_struct cinfo;
  Errors err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_error;
  err.mgr.emit_message = quiet;
  jpeg_create_decompress(&cinfo);
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  jpeg_mem_src(&cinfo, data, (unsigned long)size);
  jpeg_read_header(&cinfo, TRUE);
  if (info) {
    info->width = (int)cinfo.image_width, info->height = (int)cinfo.image_height;
    info->components = cinfo.num_components, info->progressive = cinfo.progressive_mode;
    info->precision = cinfo.data_precision;
  }
  if (out) {
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = out + (size_t)cinfo.output_scanline * pitch;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  return 1;
}

int nvjpegCreateEx(int backend, void* dev, void* pinned, unsigned flags, void** handle) {
  (void)dev, (void)pinned, (void)flags;
  if (backend != 3) return 9; /* the hardware backend only: IMPLEMENTATION_NOT_SUPPORTED */
  *handle = malloc(1);
  return 0;
}
int nvjpegDestroy(void* handle) { free(handle); return 0; }
int nvjpegGetHardwareDecoderInfo(void* handle, unsigned* n, unsigned* cores) {
  (void)handle;
  *n = (unsigned)engines, *cores = 5;
  return 0;
}
int nvjpegJpegStateCreate(void* handle, void** state) { (void)handle; *state = calloc(1, sizeof(State)); return 0; }
int nvjpegJpegStateDestroy(void* state) { free(state); return 0; }
int nvjpegJpegStreamCreate(void* handle, void** stream) { (void)handle; *stream = calloc(1, sizeof(Stream)); return 0; }
int nvjpegJpegStreamDestroy(void* stream) { free(stream); return 0; }
int nvjpegJpegStreamParseHeader(void* handle, const unsigned char* data, size_t size, void* stream) {
  (void)handle;
  return run_libjpeg(data, size, (Stream*)stream, NULL, 0) ? 0 : 3;
}
int nvjpegJpegStreamGetFrameDimensions(void* stream, unsigned* w, unsigned* h) {
  *w = (unsigned)((Stream*)stream)->width, *h = (unsigned)((Stream*)stream)->height;
  return 0;
}
int nvjpegDecodeBatchedSupported(void* handle, void* stream, int* unsupported) {
  const Stream* s = (const Stream*)stream;
  (void)handle;
  *unsupported = s->progressive || s->precision != 8 || (s->components != 1 && s->components != 3) ||
                 s->width == refuse_width;
  return 0;
}
int nvjpegDecodeBatchedPreAllocate(void* handle, void* state, int n, int w, int h, int css, int format) {
  (void)handle, (void)state, (void)n, (void)w, (void)h, (void)css;
  return format == 5 ? 0 : 2;
}
int nvjpegDecodeBatchedInitialize(void* handle, void* state, int n, int threads, int format) {
  (void)handle, (void)threads;
  ++initializes;
  if (((State*)state)->busy) ++early_reuse;
  if (n < 1 || format != 5) return 2;
  ((State*)state)->rows = n; /* the batch size of the calls that follow */
  return 0;
}
int nvjpegDecodeBatched(void* handle, void* state, const unsigned char* const* data, const size_t* lengths,
                        Image* out, void* stream) {
  const int n = ((State*)state)->rows;
  (void)handle, (void)stream;
  ++calls;
  ((State*)state)->busy = 1;
  last_called = (State*)state;
  if (n > max_rows) max_rows = n;
  if (fail_status) return fail_status;
  if (fail_batches_over > 0 && n > fail_batches_over) return 4; /* JPEG_NOT_SUPPORTED */
  for (int i = 0; i < n; ++i) {
    if (!run_libjpeg(data[i], lengths[i], NULL, out[i].channel[0], out[i].pitch[0])) return 3; /* BAD_JPEG: the batch */
  }
  rows_decoded += n;
  return 0;
}

/* The CUDA runtime's event calls: an event stands for the work of the decode call this thread
 * made last (the state it used), as NvJpegBatch records it right after that call. */
int cudaEventCreateWithFlags(void** event, unsigned flags) {
  if (flags & 1) ++blocking_events;
  *event = calloc(1, sizeof(State*));
  return 0;
}
int cudaEventRecord(void* event, void* stream) {
  (void)stream;
  ++records;
  *(State**)event = last_called;
  return 0;
}
int cudaEventSynchronize(void* event) {
  State* state = *(State**)event;
  ++syncs;
  if (state) state->busy = 0;
  return 0;
}
int cudaEventDestroy(void* event) { free(event); return 0; }
int cudaStreamSynchronize(void* stream) { (void)stream; return 0; }
const char* cudaGetErrorString(int error) { (void)error; return "fake error"; }
