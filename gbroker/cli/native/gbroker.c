/*
 * gbroker: the native front of the `gbroker` command.
 *
 * Theory of operation. A user (or a script's loop) submits one job per process, so what a
 * submission costs is the whole process: a Python interpreter alone takes 8-9 ms to start on the
 * development machine, longer than Slurm's `sbatch` takes for a whole submission. This front,
 * installed as `.venv/bin/gbroker` by scripts/setup/setup.sh (scripts/setup/build_native.sh), does
 * the most frequent command itself -- `gbroker submit FILE...`, no option -- and hands every other
 * command line, unchanged, to the Python CLI (`gbroker-py` beside it, which pip installed as
 * `gbroker`).
 *
 * It does exactly what the Python fast path does (gbroker/client/quick.py, gbroker/cli/jobs.py
 * `plain_submit`) and prints the same: the broker is `$GBROKER_URL`, else the fleet found as
 * gbroker/client/fleetdir.py finds it ($GBROKER_FLEET, the nearest .gbroker-fleet above the current
 * directory, the user's default fleet: the first still running of those its state file lists),
 * its brokers tried from a different one per process and the next when one refuses the
 * connection; the token is `$GBROKER_TOKEN`, else the file
 * `$GBROKER_TOKEN_FILE`, else the fleet's `tokens`. Each job file is sent as read, with a fresh
 * Idempotency-Key; a submission whose answer was lost (reset, timeout, 5xx) is sent again with the
 * same key, so it makes one job. The broker validates the job and answers the precise 4xx.
 *
 * Whenever it would have to do more than that -- an option, a directory, an https:// broker, a
 * token it must look up in the runtime directory, no fleet or a file it cannot read (whose error
 * messages the Python CLI words) -- it hands the command line to the Python CLI *before* sending
 * anything, so nothing is ever submitted twice and every message is the Python CLI's.
 * `GBROKER_NO_NATIVE=1` hands everything over.
 *
 * Plain HTTP/1.0 on one connection per request, as gbroker/client/quick.py speaks it; cJSON (Debian's
 * libcjson) reads the broker's JSON answers. An answer ends where its Content-Length (or its last
 * chunk) says, not when the server closes: a server that holds the connection open after a whole
 * answer has still answered. Whatever of a server's text is printed (a job id, an error) has its
 * control characters taken out first (printable()): a server's words never drive the terminal.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { OK = 0, USAGE = 2, UNREACHABLE = 4 };
enum { MAX_URLS = 256, RETRIES = 5, TIMEOUT_MS = 30000 };
#define MAX_JOB_BYTES (16L << 20)   /* the Python CLI reads any size; the broker caps bodies */
#define MAX_ANSWER_BYTES (1L << 20) /* a submission's answer is a few hundred bytes */

static char **g_argv;

/* ---------------------------------------------------------------- the hand-over to Python */

/* Run the Python CLI with the same command line (never returns). */
static void hand_over(void) {
    char self[PATH_MAX], python_cli[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            *slash = '\0';
            snprintf(python_cli, sizeof python_cli, "%s/gbroker-py", self);
            g_argv[0] = "gbroker";
            execv(python_cli, g_argv);
        }
    }
    fprintf(stderr, "gbroker: cannot run the Python CLI (gbroker-py beside %s): %s\n",
            n > 0 ? self : "this program", strerror(errno));
    exit(USAGE);
}

/* ------------------------------------------------------------------------------- helpers */

static char *read_file(const char *path, long limit, long *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > limit) {
        close(fd);
        return NULL;
    }
    char *data = malloc((size_t)st.st_size + 1);
    long have = 0;
    while (data != NULL && have < st.st_size) {
        ssize_t got = read(fd, data + have, (size_t)(st.st_size - have));
        if (got <= 0) {
            free(data);
            data = NULL;
        } else {
            have += got;
        }
    }
    close(fd);
    if (data != NULL) {
        data[have] = '\0';
        if (size != NULL) *size = have;
    }
    return data;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *join(const char *dir, const char *name) {
    char *path = NULL;
    if (asprintf(&path, "%s/%s", dir, name) < 0) hand_over();
    return path;
}

/* ------------------------------------------------------------------------ the fleet found */

/* Whether find_fleet found the user's default fleet (fleetdir.locate's "default"): say so. */
static int found_by_default = 0;

/* gbroker/client/fleetdir.py find(): the fleet's directory, or NULL (the Python CLI says why). */
static char *find_fleet(void) {
    const char *named = getenv("GBROKER_FLEET");
    if (named != NULL && *named != '\0') {
        char *fleet_file = join(named, "fleet.json");
        int there = is_file(fleet_file);
        free(fleet_file);
        if (!there) return NULL;
        if (named[0] == '/') return strdup(named);
        char here[PATH_MAX];
        return getcwd(here, sizeof here) != NULL ? join(here, named) : strdup(named);
    }
    char here[PATH_MAX];
    if (getcwd(here, sizeof here) == NULL) return NULL;
    for (;;) {
        char *candidate = join(strcmp(here, "/") == 0 ? "" : here, ".gbroker-fleet");
        if (is_dir(candidate)) {
            char *fleet_file = join(candidate, "fleet.json");
            int there = is_file(fleet_file);
            free(fleet_file);
            if (there) return candidate;
            free(candidate);
            break; /* the nearest one is down: look at the default fleet */
        }
        free(candidate);
        if (strcmp(here, "/") == 0) break;
        char *slash = strrchr(here, '/');
        if (slash == here) slash[1] = '\0';
        else *slash = '\0';
    }
    const char *state = getenv("XDG_STATE_HOME");
    char *pointer;
    if (state != NULL && *state != '\0') {
        pointer = join(state, "gbroker/default-fleet");
    } else {
        const char *home = getenv("HOME");
        if (home == NULL || *home == '\0') return NULL;
        pointer = join(home, ".local/state/gbroker/default-fleet");
    }
    char *pointed = read_file(pointer, 1 << 16, NULL);
    free(pointer);
    if (pointed == NULL) return NULL;
    /* The user's fleets, most recent first, one a line: the first that still runs. */
    char *fleet = NULL, *save = NULL;
    for (char *line = strtok_r(pointed, "\n", &save); line != NULL && fleet == NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *end = line + strlen(line);
        while (*line == ' ' || *line == '\t' || *line == '\r') line++;
        while (end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) *--end = '\0';
        if (*line == '\0') continue;
        char *fleet_file = join(line, "fleet.json");
        if (is_file(fleet_file)) fleet = strdup(line);
        free(fleet_file);
    }
    free(pointed);
    found_by_default = fleet != NULL;
    return fleet;
}

/* A token file, read as gbroker/client/quick.py reads it: the whole file one word, that word; else
 * `NAME TOKEN [admin]` lines (after `#` a comment): the first admin's token, else the first
 * token. NULL if it holds neither or cannot be read. */
static char *token_from_file(const char *path) {
    char *text = read_file(path, 1 << 20, NULL);
    if (text == NULL) return NULL;
    const char *blank = " \t\n\r\f\v";
    size_t skip = strspn(text, blank), word = strcspn(text + skip, blank);
    if (word > 0 && text[skip + word + strspn(text + skip + word, blank)] == '\0') {
        char *token = strndup(text + skip, word); /* one word in the whole file */
        free(text);
        return token;
    }
    char *first = NULL, *admin = NULL;
    char *save_line = NULL;
    for (char *line = strtok_r(text, "\n", &save_line); line != NULL;
         line = strtok_r(NULL, "\n", &save_line)) {
        char *hash = strchr(line, '#');
        if (hash != NULL) *hash = '\0';
        char *fields[4] = {0};
        int count = 0;
        char *save_word = NULL;
        for (char *w = strtok_r(line, blank, &save_word); w != NULL;
             w = strtok_r(NULL, blank, &save_word)) {
            if (count < 4) fields[count] = w;
            count++;
        }
        if (count >= 2 && first == NULL) first = fields[1];
        if (count == 3 && strcmp(fields[2], "admin") == 0 && admin == NULL) admin = fields[1];
    }
    char *token = admin != NULL ? strdup(admin) : first != NULL ? strdup(first) : NULL;
    free(text);
    return token;
}

/* ------------------------------------------------------------------------------- brokers */

typedef struct {
    char url[512];
    char host[256];
    char port[16];
} Broker;

/* An http://HOST:PORT URL (a trailing slash allowed); 0 for anything else (https://, a path,
 * IPv6 brackets, no port): those the Python CLI handles. */
static int parse_url(const char *text, Broker *broker) {
    char url[512];
    size_t length = strlen(text);
    while (length > 0 && (text[length - 1] == ' ' || text[length - 1] == '\n' ||
                          text[length - 1] == '\r' || text[length - 1] == '/'))
        length--;
    while (length > 0 && *text == ' ') text++, length--;
    if (length == 0 || length >= sizeof url - 8) return 0;
    if (strstr(text, "://") == NULL || (size_t)(strstr(text, "://") - text) > length) {
        snprintf(url, sizeof url, "http://%.*s", (int)length, text);
    } else {
        snprintf(url, sizeof url, "%.*s", (int)length, text);
    }
    if (strncmp(url, "http://", 7) != 0) return 0;
    const char *rest = url + 7;
    if (strpbrk(rest, "/[]@?#") != NULL) return 0;
    for (const char *c = rest; *c; c++) /* no blank or control byte into the request's Host */
        if ((unsigned char)*c <= ' ' || *c == 0x7f) return 0;
    const char *colon = strrchr(rest, ':');
    if (colon == NULL || colon == rest || colon[1] == '\0') return 0;
    for (const char *c = colon + 1; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    if (strlen(colon + 1) >= sizeof broker->port || (size_t)(colon - rest) >= sizeof broker->host)
        return 0;
    snprintf(broker->url, sizeof broker->url, "%s", url);
    snprintf(broker->host, sizeof broker->host, "%.*s", (int)(colon - rest), rest);
    snprintf(broker->port, sizeof broker->port, "%s", colon + 1);
    return 1;
}

/* The fleet's `brokers` file (`SITE URL` lines); the count, 0 if there is none to use. */
static int fleet_brokers(const char *fleet, Broker *brokers) {
    char *path = join(fleet, "brokers");
    char *text = read_file(path, 1 << 20, NULL);
    free(path);
    if (text == NULL) return 0;
    int count = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char *space = strchr(line, ' ');
        if (space == NULL) continue;
        if (count == MAX_URLS || !parse_url(space + 1, &brokers[count])) {
            count = 0; /* a URL we do not speak (https://...): the Python CLI's */
            break;
        }
        count++;
    }
    free(text);
    return count;
}

/* ------------------------------------------------------------------------------ exchange */

typedef enum { SENT, REFUSED, LOST } Outcome;

typedef struct {
    int status;
    char *head; /* status line and header fields */
    char *body;
    char reason[160]; /* why it was refused or lost */
} Answer;

/* The value of header field `name` in the answer's head (lower-case `name`), or NULL. */
static const char *field(const Answer *answer, const char *name, char *value, size_t size) {
    size_t length = strlen(name);
    for (const char *line = strstr(answer->head, "\r\n"); line != NULL;
         line = strstr(line + 2, "\r\n")) {
        const char *start = line + 2;
        if (strncasecmp(start, name, length) == 0 && start[length] == ':') {
            start += length + 1;
            while (*start == ' ' || *start == '\t') start++;
            const char *end = strstr(start, "\r\n");
            size_t n = end ? (size_t)(end - start) : strlen(start);
            while (n > 0 && (start[n - 1] == ' ' || start[n - 1] == '\t')) n--;
            snprintf(value, size, "%.*s", (int)n, start);
            return value;
        }
    }
    return NULL;
}

/* A chunked body's chunks, in `body[0..size)`: their length once the last chunk and the trailer
 * have arrived (with `decode`, the chunks joined in place at `body`, NUL-ended), -1 while more
 * is to come, -2 if it is not chunked encoding. */
static long chunks(char *body, size_t size, int decode) {
    size_t at = 0, out = 0;
    for (;;) {
        const char *eol = memmem(body + at, size - at, "\r\n", 2);
        if (eol == NULL) return -1;
        char *end;
        errno = 0;
        unsigned long chunk = strtoul(body + at, &end, 16);
        if (end == body + at || errno != 0) return -2;
        at = (size_t)(eol - body) + 2;
        if (chunk == 0) { /* the last chunk: trailer lines up to an empty one */
            for (;;) {
                const char *line_end = memmem(body + at, size - at, "\r\n", 2);
                if (line_end == NULL) return -1;
                int empty = line_end == body + at;
                at = (size_t)(line_end - body) + 2;
                if (empty) {
                    if (decode) body[out] = '\0';
                    return (long)out;
                }
            }
        }
        if (chunk > size - at || size - at - chunk < 2) return -1;
        if (decode) memmove(body + out, body + at, chunk);
        out += chunk;
        at += chunk + 2;
    }
}

/* Whether the answer read so far (`data[0..have)`, room for a NUL after it) is whole: its head,
 * then as many bytes as its Content-Length says or its chunks to the last. An answer with
 * neither runs to the end of the connection. */
static int whole(char *data, size_t have) {
    data[have] = '\0';
    char *split = strstr(data, "\r\n\r\n");
    if (split == NULL) return 0;
    size_t head = (size_t)(split - data) + 4;
    int status = 0;
    if (sscanf(data, "HTTP/%*s %d", &status) == 1 && (status / 100 == 1 || status == 204 ||
                                                       status == 304))
        return 1; /* no body */
    *split = '\0';
    Answer probe = {.head = data};
    char value[64];
    long length = -1;
    int chunked = 0;
    if (field(&probe, "transfer-encoding", value, sizeof value) != NULL)
        chunked = strcasestr(value, "chunked") != NULL;
    else if (field(&probe, "content-length", value, sizeof value) != NULL) {
        char *end;
        length = strtol(value, &end, 10);
        if (end == value || *end != '\0' || length < 0) length = -1;
    }
    *split = '\r';
    if (chunked) return chunks(data + head, have - head, 0) != -1;
    return length >= 0 && have - head >= (size_t)length;
}

/* `text` with its control characters taken out, in place: C0 controls but tab and newline,
 * DEL, and the C1 controls as UTF-8 spells them (U+0080-U+009F, which some terminals obey as
 * escape sequences). What a server says is printed; it never moves the cursor, clears the
 * screen, retitles the window or writes to the clipboard. */
static char *printable(char *text) {
    unsigned char *from = (unsigned char *)text, *to = from;
    while (*from) {
        if (from[0] == 0xc2 && from[1] >= 0x80 && from[1] <= 0x9f) {
            from += 2;
        } else if ((*from < 0x20 && *from != '\n' && *from != '\t') || *from == 0x7f) {
            from++;
        } else {
            *to++ = *from++;
        }
    }
    *to = '\0';
    return text;
}

static void reason_of(Answer *answer, int error) {
    if (error == EAGAIN || error == EWOULDBLOCK || error == ETIMEDOUT)
        snprintf(answer->reason, sizeof answer->reason, "timed out");
    else
        snprintf(answer->reason, sizeof answer->reason, "%s", strerror(error));
}

/* Connect to the broker: REFUSED (nothing sent: another broker may take it) or the socket. */
static int open_socket(const Broker *broker, Answer *answer) {
    struct addrinfo hints = {0}, *found = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int error = getaddrinfo(broker->host, broker->port, &hints, &found);
    if (error != 0) {
        snprintf(answer->reason, sizeof answer->reason, "%s", gai_strerror(error));
        return -1;
    }
    int sock = -1;
    errno = 0;
    for (struct addrinfo *at = found; at != NULL && sock < 0; at = at->ai_next) {
        sock = socket(at->ai_family, at->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                      at->ai_protocol);
        if (sock < 0) continue;
        if (connect(sock, at->ai_addr, at->ai_addrlen) != 0) {
            if (errno == EINPROGRESS) {
                struct pollfd wait = {sock, POLLOUT, 0};
                int ready = poll(&wait, 1, TIMEOUT_MS);
                socklen_t size = sizeof error;
                if (ready <= 0) error = ETIMEDOUT;
                else if (getsockopt(sock, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
            } else {
                error = errno;
            }
            if (error != 0) {
                reason_of(answer, error);
                close(sock);
                sock = -1;
                continue;
            }
        }
        int flags = fcntl(sock, F_GETFL);
        fcntl(sock, F_SETFL, flags & ~O_NONBLOCK);
        struct timeval limit = {TIMEOUT_MS / 1000, 0};
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
        setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    }
    freeaddrinfo(found);
    return sock;
}

static Outcome exchange(const Broker *broker, const char *request, size_t request_size,
                        const char *body, size_t body_size, Answer *answer) {
    int sock = open_socket(broker, answer);
    if (sock < 0) return REFUSED;
    const char *parts[2] = {request, body};
    size_t sizes[2] = {request_size, body_size};
    for (int part = 0; part < 2; part++) {
        size_t sent = 0;
        while (sent < sizes[part]) {
            ssize_t n = send(sock, parts[part] + sent, sizes[part] - sent, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR) continue;
                reason_of(answer, errno);
                close(sock);
                return LOST;
            }
            sent += (size_t)n;
        }
    }
    size_t capacity = 4096, have = 0;
    char *data = malloc(capacity);
    for (;;) {
        if (have + 1 >= capacity) {
            if (capacity >= MAX_ANSWER_BYTES) break;
            capacity *= 2;
            data = realloc(data, capacity);
        }
        if (data == NULL) abort();
        ssize_t n = recv(sock, data + have, capacity - have - 1, 0);
        if (n == 0) break;
        if (n < 0) {
            if (errno == EINTR) continue;
            reason_of(answer, errno);
            free(data);
            close(sock);
            return LOST;
        }
        have += (size_t)n;
        if (whole(data, have)) break; /* answered, whether or not the server closes */
    }
    close(sock);
    data[have] = '\0';
    char *split = strstr(data, "\r\n\r\n");
    int status = 0;
    if (split == NULL || sscanf(data, "HTTP/%*s %d", &status) != 1 || strncmp(data, "HTTP/", 5)) {
        snprintf(answer->reason, sizeof answer->reason, "not an HTTP answer");
        free(data);
        return LOST;
    }
    *split = '\0';
    answer->status = status;
    answer->head = data;
    answer->body = split + 4;
    char encoding[64];
    if (field(answer, "transfer-encoding", encoding, sizeof encoding) != NULL &&
        strcasestr(encoding, "chunked") != NULL &&
        chunks(answer->body, have - (size_t)(answer->body - data), 1) < 0) {
        snprintf(answer->reason, sizeof answer->reason, "not an HTTP answer (broken chunks)");
        free(data);
        return LOST;
    }
    return SENT;
}

/* The broker's message in an error answer: its JSON's "error", else the body itself. */
static char *error_text(const char *body) {
    cJSON *decoded = cJSON_Parse(body);
    char *text = NULL;
    if (decoded == NULL) {
        if (asprintf(&text, "%.300s", body) < 0) text = NULL;
        return text;
    }
    const cJSON *error = cJSON_IsObject(decoded) ? cJSON_GetObjectItemCaseSensitive(decoded, "error")
                                                 : NULL;
    if (cJSON_IsString(error)) text = strdup(error->valuestring);
    else text = cJSON_PrintUnformatted(error != NULL ? error : decoded);
    cJSON_Delete(decoded);
    return text;
}

/* Flush what was printed. A reader that went away (`gbroker submit a.yaml b.yaml | head -1`)
 * ends us silently, the shell seeing 141, even when whoever started us ignores SIGPIPE (a write
 * then fails with EPIPE instead): what the Python CLI does too (gbroker/cli/exits.py
 * reader_gone), so no further job is submitted once nobody reads the ids. */
static void flush_or_end(void) {
    if (fflush(stdout) == 0 || errno != EPIPE) return;
    signal(SIGPIPE, SIG_DFL);
    raise(SIGPIPE);
    _exit(128 + SIGPIPE); /* SIGPIPE blocked by whoever started us: the same status */
}

static void pause_for(double seconds) {
    struct timespec span = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&span, &span) != 0 && errno == EINTR) {
    }
}

/* --------------------------------------------------------------------------------- submit */

typedef struct {
    Broker *brokers;
    int count, at; /* at: the broker that took the last connection */
    const char *token, *fleet;
    int sent_any; /* a submission left this process: no hand-over after this */
} Fleet;

/* Submit one description; prints its id (with the file's name when there are several). */
static int submit_one(Fleet *fleet, const char *path, const char *description, long size,
                      int several) {
    unsigned char random[16];
    if (getrandom(random, sizeof random, 0) != (ssize_t)sizeof random) hand_over();
    char key[33];
    for (int i = 0; i < 16; i++) snprintf(key + 2 * i, 3, "%02x", random[i]);
    double delay = 0.2;
    for (int attempt = 0;; attempt++) {
        Answer answer = {0};
        char failures[4096] = "";
        Outcome outcome = REFUSED;
        for (int tried = 0; tried < fleet->count && outcome == REFUSED; tried++) {
            const Broker *broker = &fleet->brokers[(fleet->at + tried) % fleet->count];
            char *request = NULL;
            int length = asprintf(&request,
                                  "POST /api/v1/jobs HTTP/1.0\r\nHost: %s:%s\r\n"
                                  "Authorization: Bearer %s\r\nIdempotency-Key: \"%s\"\r\n"
                                  "Content-Type: application/octet-stream\r\n"
                                  "Content-Length: %ld\r\n\r\n",
                                  broker->host, broker->port, fleet->token, key, size);
            if (length < 0) abort();
            outcome = exchange(broker, request, (size_t)length, description, (size_t)size, &answer);
            free(request);
            if (outcome == REFUSED) {
                size_t used = strlen(failures);
                snprintf(failures + used, sizeof failures - used, "%s%s: %s", used ? "; " : "",
                         broker->url, answer.reason);
            } else {
                fleet->at = (fleet->at + tried) % fleet->count;
                fleet->sent_any = 1;
            }
        }
        if (outcome == REFUSED) {
            if (!fleet->sent_any) hand_over(); /* the Python CLI says so, in its words */
            fprintf(stderr, "gbroker submit: no broker answers: %s", failures);
            if (fleet->fleet != NULL)
                fprintf(stderr, " (the fleet in %s: is it down? `gbroker fleet status`)",
                        fleet->fleet);
            fputc('\n', stderr);
            return UNREACHABLE;
        }
        const Broker *broker = &fleet->brokers[fleet->at];
        int again = outcome == LOST || answer.status >= 500;
        if (again && attempt < RETRIES) { /* the same key: one job however often it arrives */
            free(answer.head);
            pause_for(delay);
            delay *= 2;
            continue;
        }
        if (outcome == LOST) {
            const char *hint = strcmp(answer.reason, "not an HTTP answer") == 0
                                   ? " (an https:// broker?)"
                                   : "";
            fprintf(stderr, "gbroker submit: %s: %s%s\n", broker->url, answer.reason, hint);
            return UNREACHABLE;
        }
        if (answer.status >= 400) {
            char *error = error_text(answer.body);
            if (error != NULL) printable(error);
            if (answer.status >= 500)
                fprintf(stderr, "gbroker submit: submission: %d: %s\n", answer.status, error);
            else
                fprintf(stderr, "gbroker submit: %s: %d: %s\n", path, answer.status, error);
            free(error);
            free(answer.head);
            return answer.status >= 500 ? UNREACHABLE : USAGE;
        }
        char location[512];
        char *id = NULL;
        cJSON *decoded = NULL;
        if (answer.status < 300 && field(&answer, "location", location, sizeof location) != NULL &&
            strncmp(location, "/api/v1/jobs/", 13) == 0) {
            id = location + 13;
        } else {
            decoded = cJSON_Parse(answer.body);
            const cJSON *value = cJSON_GetObjectItemCaseSensitive(decoded, "id");
            if (cJSON_IsString(value)) id = value->valuestring;
        }
        int code = OK;
        if (id != NULL) printable(id);
        if (id == NULL) {
            fprintf(stderr, "gbroker submit: submission: %d: an answer without a job id\n",
                    answer.status);
            code = UNREACHABLE;
        } else if (several) {
            printf("%s  %s\n", id, path);
        } else {
            printf("%s\n", id);
        }
        flush_or_end();
        cJSON_Delete(decoded);
        free(answer.head);
        return code;
    }
}

int main(int argc, char **argv) {
    g_argv = argv;
    const char *off = getenv("GBROKER_NO_NATIVE");
    if (argc < 3 || strcmp(argv[1], "submit") != 0 || (off != NULL && *off != '\0' && *off != '0'))
        hand_over();
    for (int i = 2; i < argc; i++)
        if (argv[i][0] == '-' || is_dir(argv[i])) hand_over(); /* an option, a directory */

    static Broker brokers[MAX_URLS];
    Fleet fleet = {brokers, 0, 0, NULL, NULL, 0};
    const char *named = getenv("GBROKER_URL");
    const char *token = getenv("GBROKER_TOKEN");
    const char *token_file = getenv("GBROKER_TOKEN_FILE");
    if (token != NULL && *token == '\0') token = NULL;
    if (token_file != NULL && *token_file == '\0') token_file = NULL;
    char *fleet_dir = NULL;
    if (named != NULL && *named != '\0') {
        if (!parse_url(named, &brokers[0])) hand_over();
        fleet.count = 1;
    } else {
        fleet_dir = find_fleet();
        if (fleet_dir == NULL) hand_over();
        char *tls = join(fleet_dir, "tls");
        int with_tls = is_dir(tls);
        free(tls);
        fleet.count = with_tls ? 0 : fleet_brokers(fleet_dir, brokers);
        if (fleet.count == 0) hand_over();
        fleet.at = (int)(getpid() % fleet.count); /* spread the processes over the fleet */
        fleet.fleet = fleet_dir;
        if (token == NULL && token_file == NULL) {
            char *tokens = join(fleet_dir, "tokens");
            if (is_file(tokens)) token_file = tokens;
        }
    }
    char *from_file = NULL;
    if (token == NULL) {
        if (token_file == NULL) hand_over(); /* the runtime directory's token: the Python CLI's */
        from_file = token_from_file(token_file);
        if (from_file == NULL) hand_over();
        token = from_file;
    }
    if (strpbrk(token, "\r\n") != NULL) hand_over();

    int files = argc - 2;
    char **descriptions = calloc((size_t)files, sizeof *descriptions);
    long *sizes = calloc((size_t)files, sizeof *sizes);
    for (int i = 0; i < files; i++) { /* every file read before any is sent, as the Python CLI */
        descriptions[i] = read_file(argv[i + 2], MAX_JOB_BYTES, &sizes[i]);
        if (descriptions[i] == NULL) hand_over();
    }
    fleet.token = token;
    if (found_by_default) /* fleetdir.used_note, as the Python CLI says it */
        fprintf(stderr,
                "gbroker submit: using the fleet in %s, your most recent one still running (no "
                "running .gbroker-fleet above this directory; $GBROKER_FLEET names one)\n",
                fleet_dir);
    for (int i = 0; i < files; i++) {
        int code = submit_one(&fleet, argv[i + 2], descriptions[i], sizes[i], files > 1);
        if (code != OK) return code;
    }
    return OK;
}
