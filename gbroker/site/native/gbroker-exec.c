/*
 * gbroker-exec: the last step of a job's start, between the launcher and the job's program.
 *
 *   gbroker-exec UID GID [-p FD] [-c CGROUP_DIR]... [-r RESOURCE SOFT HARD]... --
 *                PROGRAM ARGV0 [ARG]...
 *
 * The launcher (gbroker/site/launcher.py, root) spawns this by posix_spawn, which glibc does with
 * vfork: nothing of the launcher is copied, and the launcher never takes a job's ids itself (a
 * process whose real uid is a job's may be killed by that job). Here, still root: join each
 * cgroup directory given (writing 0, "this process", to its cgroup.procs), so that the job is
 * born inside its groups; set each rlimit (RESOURCE is a number, RLIMIT_*); clear the
 * supplementary groups; take GID and UID as real, effective and saved ids; execute PROGRAM (a
 * path, found by the launcher) with ARGV0 and the arguments, in the environment given. Any step
 * that fails says which on standard error (the job's) and exits 127, as a shell does for a
 * program it cannot run: the job has not started. With -p FD, it also writes "STEP\0ERRNO" to
 * FD, the launcher's report pipe, which the exec closes (close-on-exec) once the job's program
 * runs: the launcher says "started" only then, or "failed" naming the step.
 *
 * What util-linux's setpriv(1) and prlimit(1) do, in one exec of a small static program: those
 * two, dynamically linked, cost a start about 1.2 ms more CPU (measured: the notes of issue 25).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

extern char **environ;

static int report = -1; /* -p FD: the launcher's report pipe */

static int fail(const char *step, const char *what) {
    int number = errno;
    if (report >= 0) {
        char told[64];
        int length = snprintf(told, sizeof told, "%s%c%d", step, '\0', number);
        if (length > 0 && write(report, told, (size_t)length) < 0) {
            /* the launcher is gone: standard error still says it */
        }
    }
    dprintf(2, "gbroker-exec: %s %s: %s\n", step, what ? what : "", strerror(number));
    _exit(127);
}

static long number(const char *text, const char *what) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || end == text) {
        errno = EINVAL;
        fail("bad number for", what);
    }
    return value;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        errno = EINVAL;
        fail("usage:", "UID GID [-c DIR]... [-r RES SOFT HARD]... -- PROGRAM ARGV0 [ARG]...");
    }
    uid_t uid = (uid_t)number(argv[1], "uid");
    gid_t gid = (gid_t)number(argv[2], "gid");
    int i = 3;
    char path[4096];
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "-p") == 0 && i + 1 < argc) {
            report = (int)number(argv[++i], "report fd");
            if (fcntl(report, F_SETFD, FD_CLOEXEC) != 0)
                fail("report", argv[i]);
        } else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            const char *dir = argv[++i];
            if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path) {
                errno = ENAMETOOLONG;
                fail("cgroup", dir);
            }
            int fd = open(path, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, "0", 1) != 1)
                fail("cgroup", dir);
            close(fd);
        } else if (strcmp(argv[i], "-r") == 0 && i + 3 < argc) {
            int resource = (int)number(argv[i + 1], "rlimit");
            struct rlimit limit = {
                (rlim_t)number(argv[i + 2], "soft limit"),
                (rlim_t)number(argv[i + 3], "hard limit"),
            };
            if (setrlimit(resource, &limit) != 0)
                fail("rlimit", argv[i + 1]);
            i += 3;
        } else {
            errno = EINVAL;
            fail("unknown option", argv[i]);
        }
    }
    if (i + 2 >= argc) {
        errno = EINVAL;
        fail("missing", "-- PROGRAM ARGV0");
    }
    if (getuid() == 0 || geteuid() == 0) {
        if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 ||
            setresuid(uid, uid, uid) != 0)
            fail("user", argv[1]);
    } else if (getuid() != uid || getgid() != gid) {
        errno = EPERM;
        fail("user", argv[1]);
    }
    execve(argv[i + 1], argv + i + 2, environ);
    return fail("exec", argv[i + 1]);
}
