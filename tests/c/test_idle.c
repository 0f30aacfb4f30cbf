/*
 * test_idle.c - a context with nothing to do sleeps: its process uses next
 * to no CPU while idle, with a receive pending, and while a thread is
 * blocked in a wait that nobody answers.
 *
 * The bounds (5% of one core idle, 10% in a blocked wait) are generous
 * liveness bounds on sleeping behaviour, not speed claims: a spinning
 * progress thread would use ~100%.
 */
#include "harness.h"

#include <time.h>

static int64_t cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

typedef struct usage {
    int64_t cpu0, wall0;
} usage_t;

static usage_t usage_start(void)
{
    usage_t u = {cpu_us(), wall_us()};
    return u;
}

static void usage_check(usage_t u, double max_share, const char *what)
{
    double cpu = (double)(cpu_us() - u.cpu0);
    double wall = (double)(wall_us() - u.wall0);
    double share = cpu / wall;
    h_log("%s: %.1f%% of one core over %.0f ms", what, 100.0 * share,
          wall / 1000.0);
    if (share > max_share)
        h_fail(__FILE__, __LINE__, "%s used %.1f%% of a core (bound %.0f%%)",
               what, 100.0 * share, 100.0 * max_share);
}

static void case_idle(h_rank_t *r)
{
    const int peer = h_peer(r);
    /* Let connection setup settle before measuring. */
    h_sleep_ms(100);
    usage_t u = usage_start();
    h_sleep_ms(1000);
    usage_check(u, 0.05, "connected and idle");

    uint8_t buf[64];
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_recv(r->ep[peer], buf, sizeof buf, 1, &req));
    u = usage_start();
    h_sleep_ms(1000);
    usage_check(u, 0.05, "idle with a receive pending");
    H_CHECK_OK(slime_req_cancel(req));
    H_WAIT_FREE(req, SLIME_ERR_CANCELED);
}

static void case_blocked_wait(h_rank_t *r)
{
    const int peer = h_peer(r);
    uint8_t buf[64];
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_recv(r->ep[peer], buf, sizeof buf, 1, &req));
    usage_t u = usage_start();
    H_CHECK_STATUS(slime_req_wait(req, 1000), SLIME_ERR_TIMEOUT);
    usage_check(u, 0.10, "blocked in a 1 s wait");
    H_CHECK_OK(slime_req_cancel(req));
    H_WAIT_FREE(req, SLIME_ERR_CANCELED);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"idle", case_idle, 2, false, 0},
        {"blocked_wait", case_blocked_wait, 2, false, 0},
    };
    return h_main("test_idle", cases, sizeof cases / sizeof cases[0], argc,
                  argv);
}
