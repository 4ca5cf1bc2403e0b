/* fuzz_common.c - temporary files for the fuzz harnesses (see fuzz_common.h). */
#include "fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

void ar_fuzz_tmp_path(char *buf, size_t len, const char *tag, const char *suffix)
{
    const char *dir = getenv("AR_FUZZ_TMP");
    if (!dir || !*dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, len, "%s/arfuzz-%ld-%s%s", dir, (long)getpid(), tag, suffix);
}

int ar_fuzz_write_file(const char *path, const uint8_t *data /* [size] */, size_t size, bool gzip)
{
    if (gzip) {
        gzFile gz = gzopen(path, "wb1");
        if (!gz) return -1;
        int ok = size == 0 || gzwrite(gz, data, (unsigned)size) == (int)size;
        if (gzclose(gz) != Z_OK) ok = 0;
        return ok ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = size == 0 || fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}
