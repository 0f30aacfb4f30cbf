/*
 * harness.c - the supervisor that forks one process per rank for each case,
 * reaps them under a deadline, and reports; plus failing and logging.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_program = "test";
static const char *g_case = "-";
static int g_rank = -1; /* -1: the supervisor */
static char g_alarm_text[256];

const char *h_transport(void)
{
    const char *t = getenv("DLSLIME_TRANSPORT");
    return (t != NULL && t[0] != '\0') ? t : "auto";
}

int h_case_seconds(void)
{
    const char *env = getenv("DLSLIME_TEST_CASE_S");
    return env && atoi(env) > 0 ? atoi(env) : H_CASE_SECONDS;
}

/* One write() per line, so lines of concurrent ranks do not interleave. */
static void emit(const char *prefix_kind, const char *fmt, va_list ap)
{
    char line[2048];
    int n = snprintf(line, sizeof line, "[%s %s rank %d%s] ", g_program,
                     g_case, g_rank, prefix_kind);
    if (n < 0)
        return;
    if ((size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if ((size_t)n >= sizeof line - 1)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, (size_t)n);
    (void)ignored;
}

void h_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit("", fmt, ap);
    va_end(ap);
}

void h_fail(const char *file, int line, const char *fmt, ...)
{
    char text[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    h_log("FAIL %s:%d: %s", file, line, text);
    /* _exit: a failed rank skips the leak report, which would only bury
     * the real message. */
    _exit(1);
}

static void on_alarm(int sig)
{
    (void)sig;
    ssize_t ignored = write(STDERR_FILENO, g_alarm_text, strlen(g_alarm_text));
    (void)ignored;
    _exit(1);
}

static void rank_main(const h_case_t *c, h_rank_t *r, pid_t supervisor)
{
    /* If the supervisor dies (ctest timeout), take the ranks with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != supervisor)
        _exit(1);
    g_rank = r->rank;
    /* as under torchrun: each rank is a local rank (verbs picks its
     * device by it when several are listed) */
    char local_rank[16];
    snprintf(local_rank, sizeof local_rank, "%d", r->rank);
    setenv("LOCAL_RANK", local_rank, 1);
    snprintf(g_alarm_text, sizeof g_alarm_text,
             "[%s %s rank %d] FAIL: still running after %d s\n", g_program,
             g_case, g_rank, h_case_seconds());
    signal(SIGALRM, on_alarm);
    alarm((unsigned)h_case_seconds());

    if (!c->raw) {
        r->ctx = h_ctx_create(NULL);
        h_connect_all(r, r->ctx, r->ep);
        for (int k = 0; k < r->nranks; k++) {
            if (k == r->rank || strcmp(h_transport(), "auto") == 0)
                continue;
            if (strcmp(slime_ep_transport(r->ep[k]), h_transport()) != 0)
                h_fail(__FILE__, __LINE__,
                       "endpoint to rank %d uses %s, DLSLIME_TRANSPORT=%s", k,
                       slime_ep_transport(r->ep[k]), h_transport());
        }
        h_barrier(r);
    }
    c->fn(r);
    if (!c->raw) {
        /* Nobody tears down while a peer may still be finishing. */
        h_barrier(r);
        slime_ctx_destroy(r->ctx);
    }
    for (int k = 0; k < H_MAX_RANKS; k++)
        if (r->ctl[k] >= 0)
            close(r->ctl[k]);
    /* exit, not _exit: the leak checker of sanitizer builds runs here. */
    exit(0);
}

static int rank_of(const pid_t *pids, int n, pid_t pid)
{
    for (int k = 0; k < n; k++)
        if (pids[k] == pid)
            return k;
    return -1;
}

static void kill_all(pid_t *pids, const bool *reaped, int n)
{
    for (int k = 0; k < n; k++)
        if (!reaped[k] && pids[k] > 0)
            kill(pids[k], SIGKILL);
}

/* Forks the ranks of one case and judges how they end. */
static bool run_case(const h_case_t *c)
{
    const int n = c->nranks;
    int sv[H_MAX_RANKS][2];
    pid_t pids[H_MAX_RANKS] = {0};
    bool reaped[H_MAX_RANKS] = {false};
    const pid_t supervisor = getpid();

    if (n < 1 || n > H_MAX_RANKS) {
        fprintf(stderr, "[%s %s] bad rank count %d\n", g_program, c->name, n);
        return false;
    }
    for (int k = 1; k < n; k++) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv[k]) != 0) {
            perror("socketpair");
            return false;
        }
    }
    fflush(NULL);
    const int64_t start = h_now_ms();
    /* Rank 0 is forked last so that it knows every other rank's pid. */
    for (int k = n - 1; k >= 0; k--) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            kill_all(pids, reaped, n);
            return false;
        }
        if (pid == 0) {
            h_rank_t r;
            memset(&r, 0, sizeof r);
            r.rank = k;
            r.nranks = n;
            for (int j = 0; j < H_MAX_RANKS; j++)
                r.ctl[j] = -1;
            for (int j = 1; j < n; j++) {
                if (k == 0) {
                    r.ctl[j] = sv[j][0];
                    r.pid[j] = pids[j];
                    close(sv[j][1]);
                } else if (j == k) {
                    r.ctl[0] = sv[j][1];
                    close(sv[j][0]);
                } else {
                    close(sv[j][0]);
                    close(sv[j][1]);
                }
            }
            rank_main(c, &r, supervisor);
        }
        pids[k] = pid;
    }
    for (int k = 1; k < n; k++) {
        close(sv[k][0]);
        close(sv[k][1]);
    }

    bool ok = true;
    int left = n;
    const int64_t deadline = start + (int64_t)(h_case_seconds() + 10) * 1000;
    while (left > 0) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0) {
            perror("waitpid");
            ok = false;
            break;
        }
        if (pid == 0) {
            if (ok && h_now_ms() > deadline) {
                fprintf(stderr, "[%s %s] FAIL: ranks still alive at the "
                        "deadline; killing them\n", g_program, c->name);
                kill_all(pids, reaped, n);
                ok = false;
            }
            h_sleep_ms(2);
            continue;
        }
        int k = rank_of(pids, n, pid);
        if (k < 0)
            continue;
        reaped[k] = true;
        left--;
        if (!ok)
            continue; /* we killed it ourselves */
        bool fine;
        if (WIFEXITED(status))
            fine = WEXITSTATUS(status) == 0;
        else
            fine = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL &&
                   (c->mortal & (1u << k));
        if (fine)
            continue;
        if (WIFEXITED(status))
            fprintf(stderr, "[%s %s] rank %d exited with %d\n", g_program,
                    c->name, k, WEXITSTATUS(status));
        else
            fprintf(stderr, "[%s %s] rank %d killed by signal %d (%s)\n",
                    g_program, c->name, k, WTERMSIG(status),
                    strsignal(WTERMSIG(status)));
        /* The others are probably waiting on the failed rank. */
        kill_all(pids, reaped, n);
        ok = false;
    }
    fprintf(stderr, "[%s] %s %s (%lld ms)\n", g_program, ok ? "OK  " : "FAIL",
            c->name, (long long)(h_now_ms() - start));
    return ok;
}

static bool selected(const char *name, int argc, char **argv)
{
    if (argc <= 1)
        return true;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return true;
    return false;
}

/* A forced transport this machine cannot give (verbs without an RDMA
 * device) skips the program, saying why.  The probe runs in a child: the
 * supervisor never touches the library. */
static bool transport_usable(const char *program)
{
    if (strcmp(h_transport(), "auto") == 0)
        return true;
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return true;
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        slime_ctx_t *ctx = NULL;
        slime_status_t st = slime_ctx_create(NULL, &ctx);
        if (st == SLIME_OK) {
            slime_ctx_destroy(ctx);
            _exit(0);
        }
        const char *why = slime_last_error();
        ssize_t ignored = write(pipefd[1], why, strlen(why));
        (void)ignored;
        _exit(st == SLIME_ERR_UNSUPPORTED ? H_SKIP_EXIT : 1);
    }
    close(pipefd[1]);
    char why[600] = "";
    ssize_t n = pid > 0 ? read(pipefd[0], why, sizeof why - 1) : 0;
    why[n > 0 ? n : 0] = 0;
    close(pipefd[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return true;
    if (WIFEXITED(status) && WEXITSTATUS(status) == H_SKIP_EXIT) {
        fprintf(stderr, "[%s] SKIP: transport %s is not usable here: %s\n",
                program, h_transport(), why);
        return false;
    }
    return true;
}

int h_main(const char *program, const h_case_t *cases, size_t ncases,
           int argc, char **argv)
{
    g_program = program;
    setvbuf(stdout, NULL, _IOLBF, 0);
    fprintf(stderr, "[%s] transport %s (DLSLIME_TRANSPORT)\n", program,
            h_transport());
    if (!transport_usable(program))
        return H_SKIP_EXIT;
    size_t failed = 0, ran = 0;
    for (size_t i = 0; i < ncases; i++) {
        if (!selected(cases[i].name, argc, argv))
            continue;
        g_case = cases[i].name;
        ran++;
        if (!run_case(&cases[i]))
            failed++;
        g_case = "-";
    }
    fprintf(stderr, "[%s] %zu of %zu cases passed\n", program, ran - failed,
            ran);
    return (failed == 0 && ran > 0) ? 0 : 1;
}
