/* The machine's floor under a compressed index's queries: nanoseconds a random read of memory
 * costs when each read waits on the one before (a rank's line, then its offset, then the next
 * level's line), and when several independent chains interleave (the parts of an index, or
 * walks stepping together), with 4 KiB pages and with 2 MiB pages advised.
 *
 *   cc -O2 -o /tmp/memory_latency eval/memory_latency.c
 *   for huge in 0 1; do for chains in 1 3 6; do /tmp/memory_latency 1800 $huge $chains; done; done
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MiB huge(0|1) chains(1..16)\n", argv[0]);
        return 2;
    }
    size_t size = (size_t)atol(argv[1]) << 20;
    int huge = atoi(argv[2]), chains = atoi(argv[3]);
    if (chains < 1 || chains > 16) return 2;
    uint64_t *a = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return 1;
    madvise(a, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    size_t n = size / 8;
    for (size_t i = 0; i < n; i++) a[i] = (i * 0x9E3779B97F4A7C15ULL) % n;
    uint64_t x[16];
    for (int c = 0; c < chains; c++) x[c] = c * 12345;
    long steps = 2000000 / chains;
    double t = seconds();
    /* Each chain's next address depends on the value it just read. */
    for (long s = 0; s < steps; s++)
        for (int c = 0; c < chains; c++) x[c] = a[(x[c] * 0x2545F4914F6CDD1DULL + s) % n];
    double elapsed = seconds() - t;
    uint64_t sum = 0;
    for (int c = 0; c < chains; c++) sum += x[c];
    printf("%zu MiB, %s pages, %d chains: %.0f ns a step, %.0f ns a read (%lu)\n", size >> 20,
           huge ? "2 MiB" : "4 KiB", chains, elapsed / steps * 1e9, elapsed / steps / chains * 1e9,
           (unsigned long)(sum & 1));
    return 0;
}
