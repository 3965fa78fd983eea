/* The simulated `nvidia-cuda-mps-control`: NVIDIA's MPS control program, for what its consumers
 * (NVIDIA's device plugin and DRA driver, ours) use of it. A program of its own, without NVML and
 * without Python, so it runs wherever theirs does (a container, another mount namespace).
 *
 *   nvidia-cuda-mps-control -d   start the control daemon in the background; 0 once it serves
 *   nvidia-cuda-mps-control -f   the same in the foreground
 *   nvidia-cuda-mps-control      read commands on stdin, one a line, send each to the daemon and
 *                                print its answer; exit 1 when a command is refused or no daemon
 *                                serves the pipe directory
 *
 * The daemon serves the unix socket `control` in CUDA_MPS_PIPE_DIRECTORY (default
 * /tmp/nvidia-mps), holds `control_lock` there while it runs (a second daemon on the same
 * directory is refused), and logs every command and answer to CUDA_MPS_LOG_DIRECTORY/control.log
 * (default /var/log/nvidia-mps) in NVIDIA's line format. The limits in effect are written whole
 * to `deviceplugin-sim-mps.json` in the pipe directory after every change and removed at `quit`:
 * `{"pid": P, "activeThreadPercentage": 25.0, "pinnedDeviceMemoryLimitMiB": {"0": 20480}}`,
 * keyed by the device as the command named it (an index or a UUID). Like NVIDIA's, the daemon
 * keeps its pid in `nvidia-cuda-mps-control.pid` in the pipe directory while it runs. Clients
 * share the pipe directory and the daemon may run as root, so it follows no link there: the pid
 * and limits files are written to a fresh file and renamed over the name, and the lock and log
 * are opened O_NOFOLLOW.
 *
 * Commands: set_default_active_thread_percentage P (0 < P <= 100), get_default_active_thread_percentage,
 * set_default_device_pinned_mem_limit DEV LIMIT (DEV an index or a GPU-/MIG- UUID; LIMIT a
 * positive integer with the unit G or M, as NVIDIA's documentation gives it),
 * get_default_device_pinned_mem_limit DEV, quit [-t SECONDS]. Anything else is refused.
 *
 * Wire (ours): one connection per command; the client sends the line, the daemon answers one
 * byte, '0' done or '1' refused, then the text to print, and closes. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PIPE_DIR "/tmp/nvidia-mps"
#define DEFAULT_LOG_DIR "/var/log/nvidia-mps"
#define LIMITS_FILE "deviceplugin-sim-mps.json"
#define PID_FILE "nvidia-cuda-mps-control.pid"
#define MAX_DEVICES 128
#define MAX_LINE 4096
#define NO_DAEMON "Cannot find MPS control daemon process"

typedef struct {
    char device[96];
    unsigned long long mib;
    char shown[32]; /* as the command gave it: 10G, 512M */
} pinned_limit;

static char pipe_dir[PATH_MAX], log_dir[PATH_MAX];
static struct sockaddr_un address;
static FILE *log_file;
static double thread_percentage = 100.0;
static pinned_limit limits[MAX_DEVICES];
static unsigned limit_count;
static int lock_fd = -1;
static volatile sig_atomic_t stopping;

static const char *directory(const char *variable, const char *fallback) {
    const char *value = getenv(variable);
    return value && *value ? value : fallback;
}

static int paths(void) {
    snprintf(pipe_dir, sizeof pipe_dir, "%s", directory("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR));
    snprintf(log_dir, sizeof log_dir, "%s", directory("CUDA_MPS_LOG_DIRECTORY", DEFAULT_LOG_DIR));
    address.sun_family = AF_UNIX;
    if (snprintf(address.sun_path, sizeof address.sun_path, "%s/control", pipe_dir) >= (int)sizeof address.sun_path) {
        fprintf(stderr, "CUDA_MPS_PIPE_DIRECTORY %s is too long for a unix socket path\n", pipe_dir);
        return 0;
    }
    return 1;
}

/* --- the daemon ------------------------------------------------------------------------------ */

static void say(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *format, ...) {
    struct timespec now;
    struct tm local;
    char stamp[32];
    if (!log_file) return;
    clock_gettime(CLOCK_REALTIME, &now);
    localtime_r(&now.tv_sec, &local);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
    fprintf(log_file, "[%s.%03ld Control %5d] ", stamp, now.tv_nsec / 1000000, (int)getpid());
    va_list args;
    va_start(args, format);
    vfprintf(log_file, format, args);
    va_end(args);
    fputc('\n', log_file);
    fflush(log_file);
}

static int make_dirs(const char *path) {
    char partial[PATH_MAX];
    snprintf(partial, sizeof partial, "%s", path);
    for (char *c = partial + 1; *c; c++)
        if (*c == '/') {
            *c = '\0';
            if (mkdir(partial, 0755) != 0 && errno != EEXIST) return 0;
            *c = '/';
        }
    return mkdir(partial, 0755) == 0 || errno == EEXIST;
}

static void limits_path(char *out, size_t size) { snprintf(out, size, "%s/" LIMITS_FILE, pipe_dir); }

/* A file of the pipe directory replaced whole by `text`. Clients share that directory and may
 * plant links in it, and the daemon runs as root: the text goes to a fresh file of our own
 * (O_EXCL, O_NOFOLLOW) that is then renamed over the name, which replaces a link rather than
 * following it. 1 done, 0 not (errno says why). */
static int replace_file(const char *path, const char *text) {
    char scratch[PATH_MAX + 64];
    snprintf(scratch, sizeof scratch, "%s.%d", path, (int)getpid());
    unlink(scratch); /* one a killed daemon of this pid left, or a link */
    int fd = open(scratch, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return 0;
    size_t length = strlen(text);
    int done = write(fd, text, length) == (ssize_t)length;
    done = close(fd) == 0 && done;
    done = done && rename(scratch, path) == 0;
    if (!done) {
        int saved = errno;
        unlink(scratch);
        errno = saved;
    }
    return done;
}

static void record_limits(void) {
    char path[PATH_MAX + 32], text[64 + MAX_DEVICES * 128];
    size_t used;
    limits_path(path, sizeof path);
    used = (size_t)snprintf(text, sizeof text,
                            "{\"pid\": %d, \"activeThreadPercentage\": %.1f, \"pinnedDeviceMemoryLimitMiB\": {",
                            (int)getpid(), thread_percentage);
    for (unsigned i = 0; i < limit_count && used < sizeof text; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s\"%s\": %llu", i ? ", " : "", limits[i].device,
                                 limits[i].mib);
    if (used < sizeof text) snprintf(text + used, sizeof text - used, "}}\n");
    if (!replace_file(path, text)) say("cannot write %s: %s", path, strerror(errno));
}

/* The daemon's pid where NVIDIA's keeps it, for a supervisor that outlives its own restarts. */
static void record_pid(void) {
    char path[PATH_MAX + 32], text[32];
    snprintf(path, sizeof path, "%s/" PID_FILE, pipe_dir);
    snprintf(text, sizeof text, "%d\n", (int)getpid());
    if (!replace_file(path, text)) say("cannot write %s: %s", path, strerror(errno));
}

static int refuse(char *answer, size_t size, const char *format, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *answer, size_t size, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(answer, size, format, args);
    va_end(args);
    return 0;
}

/* A device as the commands name it: an index, or a GPU or MIG UUID. */
static int valid_device(const char *device) {
    size_t length = strlen(device);
    if (length == 0 || length >= sizeof limits[0].device) return 0;
    if (strspn(device, "0123456789") == length) return length <= 4;
    if (strncmp(device, "GPU-", 4) != 0 && strncmp(device, "MIG-", 4) != 0) return 0;
    return strspn(device, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-/") == length;
}

/* A limit such as 10G or 512M in MiB; 0 when it is not one. */
static unsigned long long limit_mib(const char *text) {
    size_t digits = strspn(text, "0123456789");
    if (digits == 0 || digits > 9 || strlen(text) != digits + 1) return 0;
    unsigned long long value = strtoull(text, NULL, 10);
    if (text[digits] == 'G') return value * 1024;
    return text[digits] == 'M' ? value : 0;
}

static pinned_limit *limit_of(const char *device) {
    for (unsigned i = 0; i < limit_count; i++)
        if (strcmp(limits[i].device, device) == 0) return &limits[i];
    return NULL;
}

/* Carry out one command line: 1 done, 0 refused; `answer` is what the client prints. */
static int command(char *line, char *answer, size_t size, int *quit) {
    char *words[4] = {0}, *rest = line, *word;
    unsigned count = 0;
    while ((word = strtok_r(rest, " \t\r\n", &rest)))
        if (count < 4) words[count++] = word;
        else return refuse(answer, size, "Too many arguments");
    answer[0] = '\0';
    if (count == 0) return 1;
    const char *name = words[0];
    if (strcmp(name, "quit") == 0) {
        if (count != 1 && !(count == 3 && strcmp(words[1], "-t") == 0 && strspn(words[2], "0123456789") == strlen(words[2])))
            return refuse(answer, size, "Usage: quit [-t <timeout in seconds>]");
        *quit = 1;
        return 1;
    }
    if (strcmp(name, "get_default_active_thread_percentage") == 0) {
        if (count != 1) return refuse(answer, size, "Usage: get_default_active_thread_percentage");
        snprintf(answer, size, "%.1f", thread_percentage);
        return 1;
    }
    if (strcmp(name, "set_default_active_thread_percentage") == 0) {
        char *end;
        if (count != 2) return refuse(answer, size, "Usage: set_default_active_thread_percentage <percentage>");
        errno = 0;
        double value = strtod(words[1], &end);
        if (errno || end == words[1] || *end || !(value > 0.0 && value <= 100.0))
            return refuse(answer, size, "Invalid active thread percentage %s: must be a number in (0, 100]", words[1]);
        thread_percentage = value;
        record_limits();
        snprintf(answer, size, "%.1f", thread_percentage);
        return 1;
    }
    if (strcmp(name, "get_default_device_pinned_mem_limit") == 0) {
        if (count != 2) return refuse(answer, size, "Usage: get_default_device_pinned_mem_limit <dev>");
        if (!valid_device(words[1])) return refuse(answer, size, "Invalid device %s", words[1]);
        const pinned_limit *limit = limit_of(words[1]);
        snprintf(answer, size, "%s", limit ? limit->shown : "none");
        return 1;
    }
    if (strcmp(name, "set_default_device_pinned_mem_limit") == 0) {
        if (count != 3) return refuse(answer, size, "Usage: set_default_device_pinned_mem_limit <dev> <value>");
        if (!valid_device(words[1])) return refuse(answer, size, "Invalid device %s", words[1]);
        unsigned long long mib = limit_mib(words[2]);
        if (mib == 0)
            return refuse(answer, size, "Invalid pinned memory limit %s: a positive integer followed by G or M", words[2]);
        pinned_limit *limit = limit_of(words[1]);
        if (!limit) {
            if (limit_count == MAX_DEVICES) return refuse(answer, size, "Too many devices");
            limit = &limits[limit_count++];
            snprintf(limit->device, sizeof limit->device, "%s", words[1]);
        }
        limit->mib = mib;
        snprintf(limit->shown, sizeof limit->shown, "%s", words[2]);
        record_limits();
        return 1;
    }
    return refuse(answer, size, "Unknown command %s", name);
}

static void write_all(int fd, const char *text, size_t length) {
    while (length) {
        ssize_t n = write(fd, text, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        text += n;
        length -= (size_t)n;
    }
}

/* Gone from the pipe directory, the lock given up: a new daemon may start there at once. */
static void leave(void) {
    char path[PATH_MAX + 32];
    limits_path(path, sizeof path);
    unlink(path);
    snprintf(path, sizeof path, "%s/" PID_FILE, pipe_dir);
    unlink(path);
    unlink(address.sun_path);
    close(lock_fd);
}

static void serve_one(int client, int *quit) {
    char line[MAX_LINE], answer[512];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof line - 1 && !memchr(line, '\n', got) &&
           ((n = read(client, line + got, sizeof line - 1 - got)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0) got += (size_t)n;
    line[got] = '\0';
    line[strcspn(line, "\n")] = '\0';
    say("NEW UI");
    say("Cmd:%s", line);
    int done = command(line, answer, sizeof answer, quit);
    if (answer[0]) say("%s", answer);
    if (*quit) leave(); /* before answering: `quit` returns once the daemon is gone */
    write_all(client, done ? "0" : "1", 1);
    write_all(client, answer, strlen(answer));
    say("UI closed");
}

static void on_signal(int signal) {
    (void)signal;
    stopping = 1;
}

/* Take the directory, the lock and the socket: the listening socket, or -1 with `why` said. */
static int open_daemon(char *why, size_t size) {
    char lock_path[PATH_MAX + 16], log_path[PATH_MAX + 16];
    for (const char *dir = pipe_dir; dir; dir = dir == pipe_dir ? log_dir : NULL)
        if (!make_dirs(dir)) {
            snprintf(why, size, "cannot create %.1024s: %s", dir, strerror(errno));
            return -1;
        }
    /* No file is opened through a link: clients may plant them in the pipe directory. */
    snprintf(log_path, sizeof log_path, "%s/control.log", log_dir);
    int log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (log_fd < 0 || !(log_file = fdopen(log_fd, "a"))) {
        snprintf(why, size, "cannot open %.1024s: %s", log_path, strerror(errno));
        return -1;
    }
    snprintf(lock_path, sizeof lock_path, "%s/control_lock", pipe_dir);
    lock_fd = open(lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644); /* held while the daemon lives */
    if (lock_fd < 0) {
        snprintf(why, size, "cannot open %.1024s: %s", lock_path, strerror(errno));
        return -1;
    }
    if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(why, size, "An instance of this daemon is already running");
        return -1;
    }
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(address.sun_path);
    /* Every client may connect: the socket is made 0666 by bind itself, under umask 0111, never
     * chmod'ed by a path that a client could have swapped for a link in between. */
    mode_t umask_before = umask(S_IXUSR | S_IXGRP | S_IXOTH);
    int bound = listener >= 0 && bind(listener, (struct sockaddr *)&address, sizeof address) == 0;
    umask(umask_before);
    if (!bound || listen(listener, 16) != 0) {
        snprintf(why, size, "cannot serve %.200s: %s", address.sun_path, strerror(errno));
        return -1;
    }
    /* Logged and recorded before `-d` returns: a caller reads both at once. */
    say("Starting control daemon using socket %s", address.sun_path);
    say("To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=%s", pipe_dir);
    record_limits();
    record_pid();
    return listener;
}

static int run_daemon(int listener) {
    struct sigaction action = {0};
    action.sa_handler = on_signal; /* no SA_RESTART: accept returns to see `stopping` */
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
    signal(SIGPIPE, SIG_IGN);
    int quit = 0;
    while (!quit && !stopping) {
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) continue;
        serve_one(client, &quit);
        close(client);
    }
    if (!quit) leave();
    say("%s", quit ? "Exit" : "Exit on signal");
    return 0;
}

/* -d: the daemon in a grandchild of its own session; the caller returns once it serves. */
static int daemonize(void) {
    int ready[2];
    char why[PATH_MAX + 128];
    if (pipe(ready) != 0) return 1;
    pid_t child = fork();
    if (child < 0) return 1;
    if (child > 0) {
        close(ready[1]);
        waitpid(child, NULL, 0);
        ssize_t n = read(ready[0], why, sizeof why - 1);
        if (n == 1 && why[0] == '\0') return 0;
        why[n > 0 ? n : 0] = '\0';
        fprintf(stderr, "%s\n", n > 0 ? why : "the control daemon did not start");
        return 1;
    }
    close(ready[0]);
    setsid();
    if (fork() != 0) _exit(0);
    int listener = open_daemon(why, sizeof why);
    if (listener < 0) {
        write_all(ready[1], why, strlen(why));
        _exit(1);
    }
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; fd++) dup2(null, fd);
    if (chdir("/") != 0) _exit(1);
    write_all(ready[1], "", 1);
    close(ready[1]);
    _exit(run_daemon(listener));
}

/* --- the client ------------------------------------------------------------------------------ */

/* Send one command; 1 done, 0 refused, -1 no daemon. */
static int send_command(const char *line) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    write_all(fd, line, strlen(line));
    write_all(fd, "\n", 1);
    shutdown(fd, SHUT_WR);
    char answer[MAX_LINE];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof answer - 1 && ((n = read(fd, answer + got, sizeof answer - 1 - got)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0) got += (size_t)n;
    close(fd);
    answer[got] = '\0';
    if (got == 0) return -1; /* the daemon went away before answering */
    if (got > 1) fprintf(answer[0] == '0' ? stdout : stderr, "%s\n", answer + 1);
    return answer[0] == '0';
}

static int run_client(void) {
    char line[MAX_LINE];
    int status = 0;
    signal(SIGPIPE, SIG_IGN);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *start = line;
        while (isspace((unsigned char)*start)) start++;
        if (!*start) continue;
        int done = send_command(start);
        if (done < 0) {
            fprintf(stderr, NO_DAEMON "\n");
            return 1;
        }
        if (!done) status = 1;
    }
    return status;
}

int main(int argc, char **argv) {
    if (!paths()) return 1;
    if (argc == 1) return run_client();
    if (argc == 2 && (strcmp(argv[1], "-d") == 0 || strcmp(argv[1], "-f") == 0)) {
        if (argv[1][1] == 'd') return daemonize();
        char why[PATH_MAX + 128];
        int listener = open_daemon(why, sizeof why);
        if (listener < 0) {
            fprintf(stderr, "%s\n", why);
            return 1;
        }
        return run_daemon(listener);
    }
    fprintf(stderr, "Usage: nvidia-cuda-mps-control [-d | -f]\n");
    return 1;
}
