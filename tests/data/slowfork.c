/* Preloaded (LD_PRELOAD) by tests/test_reliability.py: the child of the Nth fork
 * (SLOWFORK_N, default 2) sleeps one second in a pthread_atfork child handler. That runs
 * inside fork(), before CPython resets the child's signal state, so a signal sent to the
 * child meanwhile reaches it in the window where CPython would forget it: what happens, by
 * chance, to a Pool worker that the scheduler has not run yet when Pool.terminate() signals
 * it. The shim makes the window certain. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static int forks;

static void count_fork(void) { forks++; }

static void slow_child(void) {
    const char *n = getenv("SLOWFORK_N");
    if (forks == (n ? atoi(n) : 2)) {
        struct timespec left = {1, 0};
        while (nanosleep(&left, &left) != 0) {
        }
    }
}

__attribute__((constructor)) static void init(void) {
    pthread_atfork(count_fork, NULL, slow_child);
}
