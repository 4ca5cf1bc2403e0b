/* cuda_cublas.cu - cuBLAS loaded at run time: the search for libcublas.so.13 (dlopen), the entry
 * points attnreplay calls, and one batched GEMM of 16-bit matrices in the element strides the
 * cuda-mla backend's projections use.  `calibrate` times its bf16 GEMM through it, and cuda-mla
 * runs its bf16 / fp16 projection GEMMs through it by default, as vLLM runs them through torch's
 * GEMMs.
 *
 * cuBLAS is not linked: the few entry points used are declared by hand in cuda_cublas.h (values
 * checked against CUDA 13's cublas_api.h and library_types.h) and resolved with dlsym, so the
 * binary runs on machines without cuBLAS and the build needs no cuBLAS headers. */
#include "cuda_cublas.h"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static ar_cublas_api g_cublas;

static void append_text(char *buf, size_t len, const char *fmt, const char *a, const char *b)
{
    size_t used = strlen(buf);
    if (used + 1 >= len) return;
    snprintf(buf + used, len - used, fmt, a, b);
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* dlopens one candidate (a path, or a bare soname for the loader's own search) and resolves
 * the entry points.  Returns 0 when usable. */
static int cublas_try(const char *file)
{
    ar_cublas_api *api = &g_cublas;
    const char *slash = strrchr(file, '/');
    if (slash) {
        if (!file_exists(file)) {
            append_text(api->tried_text, sizeof api->tried_text, "%s%s: absent; ", file, "");
            return -1;
        }
        /* libcublas.so.13 needs libcublasLt.so.13; load the one beside it first so a folder
         * outside the loader's path works even without a RUNPATH. */
        char lt[600];
        snprintf(lt, sizeof lt, "%.*s/libcublasLt.so.13", (int)(slash - file), file);
        if (file_exists(lt)) dlopen(lt, RTLD_NOW | RTLD_GLOBAL);
    }
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        append_text(api->tried_text, sizeof api->tried_text, "%s: %s; ", file,
                    why ? why : "dlopen failed");
        return -1;
    }
    api->create = (ar_cublas_create_fn)dlsym(lib, "cublasCreate_v2");
    api->destroy = (ar_cublas_destroy_fn)dlsym(lib, "cublasDestroy_v2");
    api->set_stream = (ar_cublas_set_stream_fn)dlsym(lib, "cublasSetStream_v2");
    api->get_version = (ar_cublas_get_version_fn)dlsym(lib, "cublasGetVersion_v2");
    api->gemm_ex = (ar_cublas_gemm_ex_fn)dlsym(lib, "cublasGemmEx");
    api->gemm_strided_batched_ex = (ar_cublas_gemm_strided_batched_ex_fn)dlsym(lib, "cublasGemmStridedBatchedEx");
    if (!api->create || !api->destroy || !api->set_stream || !api->gemm_ex || !api->gemm_strided_batched_ex) {
        append_text(api->tried_text, sizeof api->tried_text, "%s: %s; ", file,
                    "lacks cublasCreate_v2/cublasDestroy_v2/cublasSetStream_v2/cublasGemmEx/"
                    "cublasGemmStridedBatchedEx");
        dlclose(lib);
        return -1;
    }
    api->library = lib;
    api->loaded = 1;
    /* The file the loader actually picked (a bare soname resolves to a path). */
    struct link_map *map = NULL;
    if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0])
        snprintf(api->path, sizeof api->path, "%s", map->l_name);
    else
        snprintf(api->path, sizeof api->path, "%s", file);
    return 0;
}

/* Tries every file matching a glob pattern; returns 0 at the first that loads. */
static int cublas_try_glob(const char *pattern)
{
    glob_t found;
    memset(&found, 0, sizeof found);
    if (glob(pattern, 0, NULL, &found) != 0) {
        append_text(g_cublas.tried_text, sizeof g_cublas.tried_text, "%s%s: no match; ", pattern,
                    "");
        globfree(&found);
        return -1;
    }
    int rc = -1;
    for (size_t i = 0; i < found.gl_pathc && rc != 0; i++) rc = cublas_try(found.gl_pathv[i]);
    globfree(&found);
    return rc;
}

static void cublas_search(void)
{
    ar_cublas_api *api = &g_cublas;
    if (api->tried) return;
    api->tried = 1;
    api->tried_text[0] = '\0';
    char file[600];

    const char *override = getenv("AR_CUBLAS");
    if (override && override[0]) {
        if (dir_exists(override)) {
            snprintf(file, sizeof file, "%s/libcublas.so.13", override);
            cublas_try(file);
        } else {
            cublas_try(override);
        }
        return;   /* AR_CUBLAS replaces the search */
    }
    if (cublas_try("libcublas.so.13") == 0) return;
    if (cublas_try("/usr/local/cuda/lib64/libcublas.so.13") == 0) return;
    if (cublas_try("/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13") == 0) return;
    const char *cuda_home = getenv("CUDA_HOME");
    if (cuda_home && cuda_home[0]) {
        snprintf(file, sizeof file, "%s/lib64/libcublas.so.13", cuda_home);
        if (cublas_try(file) == 0) return;
    }
    static const char *const site_dirs[] = {
        "/opt/torch/.venv/lib/python3.12/site-packages",
        "/usr/local/lib/python3*/dist-packages",
    };
    static const char *const sub_dirs[] = { "nvidia/cu13/lib", "nvidia/cublas/lib" };
    for (size_t s = 0; s < sizeof site_dirs / sizeof site_dirs[0]; s++) {
        for (size_t d = 0; d < sizeof sub_dirs / sizeof sub_dirs[0]; d++) {
            snprintf(file, sizeof file, "%s/%s/libcublas.so.13", site_dirs[s], sub_dirs[d]);
            if (cublas_try_glob(file) == 0) return;
        }
    }
}

const ar_cublas_api *ar_cublas_load(char *err, size_t err_len)
{
    cublas_search();
    if (g_cublas.loaded) return &g_cublas;
    snprintf(err, err_len, "cuBLAS not loadable (tried %s)", g_cublas.tried_text);
    return NULL;
}

int ar_cuda_cublas_probe(char *path, size_t path_len, char *err, size_t err_len)
{
    const ar_cublas_api *api = ar_cublas_load(err, err_len);
    if (!api) return -1;
    snprintf(path, path_len, "%s", api->path);
    return 0;
}

int ar_cublas_gemm_16(void *handle, const ar_cublas_gemm *g)
{
    const ar_cublas_api *api = &g_cublas;
    if (!api->loaded || !handle) return -1;
    /* C (row-major, column stride 1) is C^T column-major with ld = c_m; C^T = B^T A^T */
    if (g->c_n != 1) return -1;
    int op_x, ld_x, op_y, ld_y;
    if (g->b_n == 1) {
        op_x = AR_CUBLAS_OP_N;   /* B^T (N x K) column-major, ld b_k */
        ld_x = (int)g->b_k;
    } else if (g->b_k == 1) {
        op_x = AR_CUBLAS_OP_T;   /* B^T's transpose (K x N) column-major, ld b_n */
        ld_x = (int)g->b_n;
    } else {
        return -1;
    }
    if (g->a_k == 1) {
        op_y = AR_CUBLAS_OP_N;   /* A^T (K x M) column-major, ld a_m */
        ld_y = (int)g->a_m;
    } else if (g->a_m == 1) {
        op_y = AR_CUBLAS_OP_T;
        ld_y = (int)g->a_k;
    } else {
        return -1;
    }
    const int type = g->bf16 ? AR_CUDA_R_16BF : AR_CUDA_R_16F;
    const float alpha = 1.0f, beta = 0.0f;
    return api->gemm_strided_batched_ex(handle, op_x, op_y, g->N, g->M, g->K, &alpha, g->B, type, ld_x, g->b_b,
                                        g->A, type, ld_y, g->a_b, &beta, g->C, type, (int)g->c_m, g->c_b, g->batch,
                                        AR_CUBLAS_COMPUTE_32F, AR_CUBLAS_GEMM_DEFAULT);
}
