/*
 * A wall clock that the chaos nemesis can step, for one node process.
 *
 * Loaded with LD_PRELOAD into a runnode process, it adds an offset to CLOCK_REALTIME (and to
 * gettimeofday() and time()), as an NTP step or an operator's `date -s` would: the monotonic
 * clocks, and every sleep and timeout measured on them, are untouched. The offset (int64
 * nanoseconds) is read from the first 8 bytes of the file named by CLOCK_SHIM_FILE, mapped
 * shared, so the nemesis changes it while the process runs. Without the variable, or with a
 * file that cannot be mapped, the clock is the system's.
 *
 * Built by chaos.clock at the start of a chaos run: cc -shared -fPIC -O2 -o X.so X.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns = NULL;
static int (*real_clock_gettime)(clockid_t, struct timespec *) = NULL;

static void setup(void) {
    if (real_clock_gettime != NULL) return;
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("CLOCK_SHIM_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) offset_ns = (volatile int64_t *)map;
}

static int64_t current_offset(void) {
    return offset_ns != NULL ? *offset_ns : 0;
}

static void shift(struct timespec *ts, int64_t ns) {
    int64_t total = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + ns;
    ts->tv_sec = (time_t)(total / 1000000000LL);
    ts->tv_nsec = (long)(total % 1000000000LL);
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000L;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    setup();
    int result = real_clock_gettime(clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        shift(ts, current_offset());
    }
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    if (tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
