/* Calls one TVM-built CPU kernel library without Python or libtvm, so that valgrind can profile it.
 *
 * usage: harness LIBRARY.so ENTRY THREADS MODE TENSOR...
 *   TENSOR  dtype:shape, e.g. float32:1x3x224x224 (shape "" for a scalar tensor)
 *   MODE    profile: run the kernel once inside profiled_call (callgrind collects only there), only
 *                    parallel task 0 of THREADS: one core's share of the work;
 *           outputs: run every task once and write every tensor's bytes to stdout (tests compare them
 *                    with TVM's own runtime).
 *
 * It fills in the runtime services the library reaches through function-pointer globals (TVM 0.27's
 * codegen: __TVMBackendParallelLaunch, __TVMBackendAllocWorkspace, ...). A library that needs anything
 * else (packed calls into other modules) is refused with exit code 3. Inputs are filled like the
 * measurer fills them: random floats, zero integers (indices stay in bounds).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int32_t type_index; uint32_t zero_padding; union { int64_t v_int64; void *v_ptr; }; } Any;
typedef struct { uint8_t code, bits; uint16_t lanes; } DataType;
typedef struct {
    void *data; int32_t device_type, device_id; int32_t ndim; DataType dtype;
    int64_t *shape, *strides; uint64_t byte_offset;
} Tensor;
typedef struct { void *sync_handle; int32_t num_task; } ParallelEnv;
typedef int (*ParallelLambda)(int task_id, ParallelEnv *env, void *cdata);
typedef int (*Entry)(void *self, const Any *args, int32_t n, Any *result);

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_BOOL = 6, FFI_TENSOR_PTR = 7 };

static int threads = 1, all_tasks = 0;

static int parallel_launch(ParallelLambda f, void *cdata, int num_task) {
    (void)num_task;  /* 0 = "as many as the pool has": the target's cores */
    ParallelEnv env = {NULL, threads};
    for (int task = 0; task < (all_tasks ? threads : 1); task++)
        if (f(task, &env, cdata) != 0) return -1;
    return 0;
}
static int parallel_barrier(int task_id, ParallelEnv *env) { (void)task_id; (void)env; return 0; }
static void *alloc_workspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits) {
    (void)dev_type; (void)dev_id; (void)code; (void)bits;
    return aligned_alloc(64, (nbytes + 63) / 64 * 64);
}
static int free_workspace(int dev_type, int dev_id, void *ptr) { (void)dev_type; (void)dev_id; free(ptr); return 0; }
static int unsupported(void) {
    fprintf(stderr, "harness: the kernel calls into the TVM runtime (a packed function), which this harness lacks\n");
    exit(3);
}

/* Resolved from the library (undefined there) when the kernel rejects its arguments. */
void TVMFFIErrorSetRaisedFromCStrParts(const char *kind, const char **parts, int32_t n) {
    fprintf(stderr, "harness: kernel error %s:", kind);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", parts[i]);
    fprintf(stderr, "\n");
}
void TVMFFIErrorSetRaisedFromCStr(const char *kind, const char *message) {
    fprintf(stderr, "harness: kernel error %s: %s\n", kind, message);
}

static uint64_t rng = 88172645463325252ull;
static double next_uniform(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void parse_tensor(const char *spec, Tensor *t) {
    char dtype[32];
    const char *colon = strchr(spec, ':');
    if (!colon || colon - spec >= (long)sizeof dtype) { fprintf(stderr, "harness: bad tensor %s\n", spec); exit(2); }
    memcpy(dtype, spec, colon - spec); dtype[colon - spec] = 0;
    int bits = 0;
    memset(t, 0, sizeof *t);
    t->device_type = 1;  /* kDLCPU */
    if (!strcmp(dtype, "bool")) { t->dtype.code = DL_BOOL; bits = 8; }
    else if (sscanf(dtype, "float%d", &bits) == 1) t->dtype.code = DL_FLOAT;
    else if (sscanf(dtype, "bfloat%d", &bits) == 1) t->dtype.code = DL_BFLOAT;
    else if (sscanf(dtype, "uint%d", &bits) == 1) t->dtype.code = DL_UINT;
    else if (sscanf(dtype, "int%d", &bits) == 1) t->dtype.code = DL_INT;
    else { fprintf(stderr, "harness: unknown dtype %s\n", dtype); exit(2); }
    t->dtype.bits = (uint8_t)bits; t->dtype.lanes = 1;
    t->shape = calloc(16, sizeof(int64_t));
    int64_t elements = 1;
    for (const char *p = colon + 1; *p; ) {
        char *end;
        long long d = strtoll(p, &end, 10);
        if (end == p || t->ndim == 16) { fprintf(stderr, "harness: bad shape %s\n", spec); exit(2); }
        t->shape[t->ndim++] = d; elements *= d;
        p = *end == 'x' ? end + 1 : end;
    }
    size_t bytes = (size_t)elements * ((bits + 7) / 8);
    t->data = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (t->dtype.code == DL_FLOAT && bits == 32)
        for (int64_t i = 0; i < elements; i++) ((float *)t->data)[i] = (float)next_uniform();
    else if (t->dtype.code == DL_FLOAT && bits == 64)
        for (int64_t i = 0; i < elements; i++) ((double *)t->data)[i] = next_uniform();
    else
        memset(t->data, 0, bytes);
}

static size_t tensor_bytes(const Tensor *t) {
    size_t n = (t->dtype.bits + 7) / 8;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

static Entry entry;
static Any *args;
static int n_args;

/* callgrind collects only inside this function (--toggle-collect=profiled_call) */
__attribute__((noinline)) int profiled_call(void) {
    Any result = {0};
    return entry(NULL, args, n_args, &result);
}

static void bind(void *library, const char *name, void *function) {
    void **slot = dlsym(library, name);
    if (slot) *slot = function;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: harness LIBRARY.so ENTRY THREADS profile|outputs TENSOR...\n"); return 2; }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!library) { fprintf(stderr, "harness: %s\n", dlerror()); return 2; }
    char symbol[256];
    snprintf(symbol, sizeof symbol, "__tvm_ffi_%s", argv[2]);
    entry = (Entry)dlsym(library, symbol);
    if (!entry) { fprintf(stderr, "harness: no function %s in %s\n", symbol, argv[1]); return 2; }
    threads = atoi(argv[3]) > 0 ? atoi(argv[3]) : 1;
    all_tasks = !strcmp(argv[4], "outputs");
    bind(library, "__TVMBackendParallelLaunch", (void *)parallel_launch);
    bind(library, "__TVMBackendParallelBarrier", (void *)parallel_barrier);
    bind(library, "__TVMBackendAllocWorkspace", (void *)alloc_workspace);
    bind(library, "__TVMBackendFreeWorkspace", (void *)free_workspace);
    bind(library, "__TVMFFIFunctionCall", (void *)unsupported);
    bind(library, "__TVMFFIEnvModLookupFromImports", (void *)unsupported);
    bind(library, "__TVMFFIErrorSetRaisedFromCStr", (void *)TVMFFIErrorSetRaisedFromCStr);
    n_args = argc - 5;
    Tensor *tensors = calloc(n_args, sizeof(Tensor));
    args = calloc(n_args, sizeof(Any));
    for (int i = 0; i < n_args; i++) {
        parse_tensor(argv[5 + i], &tensors[i]);
        args[i].type_index = FFI_TENSOR_PTR;
        args[i].v_ptr = &tensors[i];
    }
    if (all_tasks) {
        if (profiled_call() != 0) return 4;
        for (int i = 0; i < n_args; i++) fwrite(tensors[i].data, 1, tensor_bytes(&tensors[i]), stdout);
        return 0;
    }
    if (strcmp(argv[4], "profile")) {
        fprintf(stderr, "harness: unknown mode %s\n", argv[4]);
        return 2;
    }
    return profiled_call() != 0 ? 4 : 0;
}
