/*
 * A stand-in libnvidia-ml.so.1 for wattline's NVML tests: exports only the NVML entry
 * points that the real nvidia-ml-py bindings resolve for wattline.agent.sources.nvml, and
 * answers from a scenario file named by WATTLINE_NVML_SCENARIO (read at the first
 * nvmlInitWithFlags).
 *
 * Scenario format: one statement a line, '#' starts a comment.
 *
 *   driver 550.54.15          nvmlSystemGetDriverVersion
 *   init_error 9              nvmlInitWithFlags returns this code (9: DriverNotLoaded)
 *   gpu <uuid> <name...>      starts a GPU; the statements below apply to it
 *   handle_error 4            nvmlDeviceGetHandleByIndex_v2 returns this code
 *   energy   v0 v1 ...        nvmlDeviceGetTotalEnergyConsumption, mJ
 *   power    v0 v1 ...        nvmlDeviceGetPowerUsage, mW
 *   instant  v0 v1 ...        nvmlDeviceGetFieldValues NVML_FI_DEV_POWER_INSTANT (186), mW
 *   util     g:m ...          nvmlDeviceGetUtilizationRates, gpu:memory percent
 *   memory   total:used ...   nvmlDeviceGetMemoryInfo (v1), bytes
 *   limit    v0 ...           nvmlDeviceGetEnforcedPowerLimit, mW
 *   mgmt_limit v0 ...         nvmlDeviceGetPowerManagementLimit, mW
 *   mig <current> <max>       nvmlDeviceGetMigMode current (=pending) and MaxMigDeviceCount
 *   mig_device <slot> <uuid> <gpu instance id> <total> <used>
 *   mig_process <slot> <pid> <used bytes>
 *   process <pid> <used bytes> <sm percent | ->
 *   sample_period_ms <ms>     the driver's utilization sample period (default 167: 1/6 s)
 *   energy_model <idle W> <W per SM percent> <epoch unix s>
 *                             nvmlDeviceGetTotalEnergyConsumption follows the wall clock:
 *                             idle W x (now - epoch) + W per SM percent x the SM percent of
 *                             every live-process line (below) integrated up to now, in mJ.
 *                             Every process (each loads its own copy) reads the same counter.
 *                             With an "energy" series too, the series answers the counter
 *                             (no counter: "energy ns") and the model only power.
 *
 * Unkind by default (UNKIND.md says where each behaviour comes from): every GPU starts as
 * drivers answer in the wild, as if its statements began with
 *
 *   energy_step_ms 100 0
 *   power_sensing 100 25 1000
 *   process_quirks pad stale pid0 over100 dup
 *
 * and a statement below replaces that default for its GPU; "kind" turns all three off (the
 * documented semantics, for a test of them).
 *
 *   kind                      no steps, instantaneous power, no quirks
 *   energy_step_ms <ms> [<phase ms>] | off
 *                             the model's counter advances only at phase + k x ms (Unix
 *                             time): a read returns the energy up to the last step
 *   power_sensing <update ms> <window ms> <average ms> | off
 *                             model power (nvmlDeviceGetPowerUsage): updated every update
 *                             ms, the mean of the model's power over the first window ms of
 *                             each update period (part-time sensing) whose window ended in
 *                             the last average ms before that update; off: the reading is
 *                             the model's instantaneous power, as is the
 *                             NVML_FI_DEV_POWER_INSTANT field without an "instant" series
 *   process_quirks <quirk>... | none
 *                             nvmlDeviceGetProcessUtilization as drivers answer in the wild
 *                             (the quirks listed, the others off):
 *                             pad     the size query answers the buffer size (100) whatever
 *                                     the samples, and the filled call leaves the count at
 *                                     the caller's size, zero entries after the real ones
 *                             stale   each process also gets a sample stamped before
 *                                     lastSeenTimeStamp (100 % SM and memory)
 *                             pid0    a sample of pid 0 (37 % SM)
 *                             over100 a sample of a zombie pid at 250 % SM
 *                             dup     each process also gets an older sample newer than
 *                                     lastSeenTimeStamp (0 %)
 *
 * Always (no statement turns them off): an exited process's samples go with it (only live
 * pids are sampled; UNKIND.md), and the driver samples at its own pace (sample_period_ms).
 *
 * Unkind on request:
 *
 *   unprivileged              the calls a caller without privileges is refused answer
 *                             NVML_ERROR_NO_PERMISSION (4): a MIG parent's running processes
 *                             and a MIG instance's memory
 *
 * Live processes: the file named by WATTLINE_NVML_PROCS (optional), read again at every
 * query, one process a line:
 *
 *   <gpu index>[/<MIG slot>] <pid> <sm percent> <mem percent> <from unix s> <until unix s | ->
 *
 * (with a MIG slot the process runs on that MIG instance: listed by the instance and,
 * aggregated, by its parent; MIG has no per-process utilization samples)
 * Such a process runs on that GPU from `from` until `until` while its pid lives (kill 0):
 * nvmlDeviceGetComputeRunningProcesses lists it (usedGpuMemory 1 MiB), and the driver
 * takes a utilization sample of it every sample period (CPU time stamps k x period, us;
 * the sample at ts is its mean use over (ts - period, ts], so a window's edges count pro
 * rata). nvmlDeviceGetProcessUtilization(lastSeenTimeStamp) answers as NVML documents it:
 * one nvmlProcessUtilizationSample_t per process with non-zero use in the buffered samples
 * newer than lastSeenTimeStamp (the driver keeps the last 100), its smUtil / memUtil the
 * mean over those sample periods (rounded to an integer, as NVML's are) and its timeStamp
 * the newest sample's with use; NVML_ERROR_NOT_FOUND when there is none; a NULL buffer (or
 * one too small) gets NVML_ERROR_INSUFFICIENT_SIZE and the count. The energy model
 * integrates the lines' windows whether or not the pid lives.
 *
 * Series: each call of that function on that GPU takes the next value (call k gets value
 * k; after the last one the last repeats). "ns" answers NotSupported (3), "eN" answers
 * error N (e15: GpuIsLost). A query with no statement answers NotSupported, as does
 * nvmlDeviceGetMigMode without "mig". Calls are counted per function for the tests:
 * stub_call_count(name), stub_reset_counts().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <sys/time.h>
#include <math.h>

#define MAX_GPUS 16
#define MAX_MIG 8
#define MAX_STEPS 256
#define MAX_PROCS 16
#define NO_ID 0xFFFFFFFFu

enum {
    OK = 0, E_UNINIT = 1, E_INVALID = 2, E_NOT_SUPPORTED = 3, E_NO_PERMISSION = 4, E_NOT_FOUND = 6,
    E_INSUFFICIENT_SIZE = 7, E_UNKNOWN = 999
};

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    unsigned int valueType;
    unsigned int nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* ---- scenario state ---------------------------------------------------------------- */

enum { S_ENERGY, S_POWER, S_INSTANT, S_UTIL, S_MEMORY, S_LIMIT, S_MGMT_LIMIT, S_COUNT };
static const char *series_names[S_COUNT] = {
    "energy", "power", "instant", "util", "memory", "limit", "mgmt_limit"};

typedef struct {
    int present, n;
    long long a[MAX_STEPS], b[MAX_STEPS];
    int err[MAX_STEPS];
} series_t;

typedef struct { unsigned int pid; unsigned long long mem; int sm; } proc_t;

typedef struct {
    int present;
    char uuid[96];
    unsigned int gi;
    unsigned long long total, used;
    int nprocs;
    proc_t procs[MAX_PROCS];
} mig_t;

typedef struct {
    char uuid[96], name[96];
    int handle_error;
    series_t s[S_COUNT];
    int calls[S_COUNT];
    int mig_mode; /* -1: MIG not supported */
    unsigned int mig_max;
    mig_t migs[MAX_MIG];
    int nprocs;
    proc_t procs[MAX_PROCS];
    unsigned long long sample_epoch;
    long long sample_period_us;
    int energy_model;
    double idle_w, w_per_sm, model_epoch;
    double step_s, step_phase_s;                  /* energy_step_ms (0: no steps) */
    double sense_update_s, sense_window_s, sense_average_s; /* power_sensing (0: instant) */
    int pad, stale, pid0, over100, dup;           /* process_quirks */
    int unprivileged;
} gpu_t;

static gpu_t gpus[MAX_GPUS];
static int ngpus;
static int loaded;
static int init_error;
static int refcount;
static char driver[80] = "999.99.99";

/* ---- call counting ------------------------------------------------------------------ */

#define MAX_FUNCS 32
static const char *func_names[MAX_FUNCS];
static unsigned long long func_calls[MAX_FUNCS];

static void count_call(const char *name) {
    for (int i = 0; i < MAX_FUNCS; i++) {
        if (func_names[i] == NULL) func_names[i] = name;
        if (strcmp(func_names[i], name) == 0) { func_calls[i]++; return; }
    }
}

unsigned long long stub_call_count(const char *name) {
    for (int i = 0; i < MAX_FUNCS && func_names[i] != NULL; i++)
        if (strcmp(func_names[i], name) == 0) return func_calls[i];
    return 0;
}

void stub_reset_counts(void) { memset(func_calls, 0, sizeof func_calls); }

#define ENTER() count_call(__func__); if (refcount <= 0) return E_UNINIT

/* ---- parsing ----------------------------------------------------------------------- */

static int fail(int lineno, const char *why) {
    fprintf(stderr, "libnvml_stub: scenario line %d: %s\n", lineno, why);
    return -1;
}

static int parse_series(series_t *s, char *save) {
    char *tok;
    s->present = 1;
    while ((tok = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
        if (s->n >= MAX_STEPS) return -1;
        int k = s->n++;
        if (strcmp(tok, "ns") == 0) s->err[k] = E_NOT_SUPPORTED;
        else if (tok[0] == 'e') s->err[k] = atoi(tok + 1);
        else {
            char *colon = strchr(tok, ':');
            s->a[k] = strtoll(tok, NULL, 10);
            s->b[k] = colon ? strtoll(colon + 1, NULL, 10) : 0;
        }
    }
    return s->n > 0 ? 0 : -1;
}

/* A GPU as drivers answer in the wild (on: the default of every GPU), or as NVML documents
 * it (off: the "kind" statement). */
static void unkind(gpu_t *g, int on) {
    g->step_s = on ? 0.1 : 0.0;
    g->step_phase_s = 0.0;
    g->sense_update_s = on ? 0.1 : 0.0;
    g->sense_window_s = on ? 0.025 : 0.0;
    g->sense_average_s = on ? 1.0 : 0.0;
    g->pad = g->stale = g->pid0 = g->over100 = g->dup = on;
}

static int parse_line(char *line, int lineno) {
    char *save = NULL, *key = strtok_r(line, " \t\r\n", &save);
    gpu_t *g = ngpus > 0 ? &gpus[ngpus - 1] : NULL;
    if (key == NULL) return 0;
    if (strcmp(key, "driver") == 0) {
        char *v = strtok_r(NULL, " \t\r\n", &save);
        if (v == NULL) return fail(lineno, "driver needs a version");
        snprintf(driver, sizeof driver, "%s", v);
        return 0;
    }
    if (strcmp(key, "init_error") == 0) {
        char *v = strtok_r(NULL, " \t\r\n", &save);
        init_error = v ? atoi(v) : E_UNKNOWN;
        return 0;
    }
    if (strcmp(key, "gpu") == 0) {
        if (ngpus >= MAX_GPUS) return fail(lineno, "too many GPUs");
        g = &gpus[ngpus++];
        memset(g, 0, sizeof *g);
        g->mig_mode = -1;
        g->sample_period_us = 167000;
        unkind(g, 1);
        char *uuid = strtok_r(NULL, " \t\r\n", &save);
        char *name = strtok_r(NULL, "\r\n", &save);
        if (uuid == NULL) return fail(lineno, "gpu needs a uuid");
        snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
        snprintf(g->name, sizeof g->name, "%s", name ? name : "NVIDIA Stub GPU");
        return 0;
    }
    if (g == NULL) return fail(lineno, "statement before the first gpu");
    for (int i = 0; i < S_COUNT; i++)
        if (strcmp(key, series_names[i]) == 0)
            return parse_series(&g->s[i], save) == 0 ? 0 : fail(lineno, "bad series");
    if (strcmp(key, "sample_period_ms") == 0) {
        char *v = strtok_r(NULL, " \t\r\n", &save);
        if (v == NULL || atoi(v) <= 0) return fail(lineno, "sample_period_ms <ms>");
        g->sample_period_us = 1000LL * atoi(v);
        return 0;
    }
    if (strcmp(key, "energy_model") == 0) {
        char *f[3];
        for (int i = 0; i < 3; i++)
            if ((f[i] = strtok_r(NULL, " \t\r\n", &save)) == NULL)
                return fail(lineno, "energy_model <idle W> <W per SM percent> <epoch unix s>");
        g->energy_model = 1;
        g->idle_w = atof(f[0]);
        g->w_per_sm = atof(f[1]);
        g->model_epoch = atof(f[2]);
        return 0;
    }
    if (strcmp(key, "kind") == 0) {
        unkind(g, 0);
        return 0;
    }
    if (strcmp(key, "energy_step_ms") == 0) {
        char *v = strtok_r(NULL, " \t\r\n", &save), *phase = strtok_r(NULL, " \t\r\n", &save);
        if (v != NULL && strcmp(v, "off") == 0 && phase == NULL) {
            g->step_s = 0;
            return 0;
        }
        if (v == NULL || atof(v) <= 0) return fail(lineno, "energy_step_ms <ms> [<phase ms>] | off");
        g->step_s = atof(v) / 1000.0;
        g->step_phase_s = phase ? atof(phase) / 1000.0 : 0.0;
        return 0;
    }
    if (strcmp(key, "power_sensing") == 0) {
        char *f[3];
        for (int i = 0; i < 3; i++) {
            f[i] = strtok_r(NULL, " \t\r\n", &save);
            if (i == 0 && f[0] != NULL && strcmp(f[0], "off") == 0) {
                g->sense_update_s = 0;
                return strtok_r(NULL, " \t\r\n", &save) == NULL ? 0 : fail(lineno, "power_sensing off");
            }
            if (f[i] == NULL || atof(f[i]) <= 0)
                return fail(lineno, "power_sensing <update ms> <window ms> <average ms> | off");
        }
        g->sense_update_s = atof(f[0]) / 1000.0;
        g->sense_window_s = atof(f[1]) / 1000.0;
        g->sense_average_s = atof(f[2]) / 1000.0;
        if (g->sense_window_s > g->sense_update_s) return fail(lineno, "power_sensing: window longer than update");
        return 0;
    }
    if (strcmp(key, "process_quirks") == 0) {
        char *q = strtok_r(NULL, " \t\r\n", &save);
        g->pad = g->stale = g->pid0 = g->over100 = g->dup = 0;
        if (q != NULL && strcmp(q, "none") == 0)
            return strtok_r(NULL, " \t\r\n", &save) == NULL ? 0 : fail(lineno, "process_quirks none");
        for (; q != NULL; q = strtok_r(NULL, " \t\r\n", &save)) {
            if (strcmp(q, "pad") == 0) g->pad = 1;
            else if (strcmp(q, "stale") == 0) g->stale = 1;
            else if (strcmp(q, "pid0") == 0) g->pid0 = 1;
            else if (strcmp(q, "over100") == 0) g->over100 = 1;
            else if (strcmp(q, "dup") == 0) g->dup = 1;
            else return fail(lineno, "process_quirks: pad stale pid0 over100 dup | none");
        }
        return 0;
    }
    if (strcmp(key, "unprivileged") == 0) {
        g->unprivileged = 1;
        return 0;
    }
    if (strcmp(key, "handle_error") == 0) {
        char *v = strtok_r(NULL, " \t\r\n", &save);
        g->handle_error = v ? atoi(v) : E_UNKNOWN;
        return 0;
    }
    if (strcmp(key, "mig") == 0) {
        char *mode = strtok_r(NULL, " \t\r\n", &save), *max = strtok_r(NULL, " \t\r\n", &save);
        if (mode == NULL || max == NULL) return fail(lineno, "mig <current> <max>");
        g->mig_mode = atoi(mode);
        g->mig_max = (unsigned int)atoi(max);
        return 0;
    }
    if (strcmp(key, "mig_device") == 0) {
        char *f[5];
        for (int i = 0; i < 5; i++)
            if ((f[i] = strtok_r(NULL, " \t\r\n", &save)) == NULL)
                return fail(lineno, "mig_device <slot> <uuid> <gi> <total> <used>");
        int slot = atoi(f[0]);
        if (slot < 0 || slot >= MAX_MIG) return fail(lineno, "bad MIG slot");
        mig_t *m = &g->migs[slot];
        m->present = 1;
        snprintf(m->uuid, sizeof m->uuid, "%s", f[1]);
        m->gi = (unsigned int)atoi(f[2]);
        m->total = strtoull(f[3], NULL, 10);
        m->used = strtoull(f[4], NULL, 10);
        return 0;
    }
    if (strcmp(key, "mig_process") == 0 || strcmp(key, "process") == 0) {
        int is_mig = key[0] == 'm';
        char *f[3];
        for (int i = 0; i < 3; i++) f[i] = strtok_r(NULL, " \t\r\n", &save);
        if (f[0] == NULL || f[1] == NULL || f[2] == NULL) return fail(lineno, "bad process");
        int *n = &g->nprocs;
        proc_t *procs = g->procs;
        if (is_mig) {
            int slot = atoi(f[0]);
            if (slot < 0 || slot >= MAX_MIG || !g->migs[slot].present)
                return fail(lineno, "mig_process before its mig_device");
            n = &g->migs[slot].nprocs;
            procs = g->migs[slot].procs;
            f[0] = f[1];
            f[1] = f[2];
            f[2] = "-";
        }
        if (*n >= MAX_PROCS) return fail(lineno, "too many processes");
        proc_t *p = &procs[(*n)++];
        p->pid = (unsigned int)atoi(f[0]);
        p->mem = strtoull(f[1], NULL, 10);
        p->sm = strcmp(f[2], "-") == 0 ? -1 : atoi(f[2]);
        return 0;
    }
    return fail(lineno, "unknown statement");
}

static int load_scenario(void) {
    const char *path = getenv("WATTLINE_NVML_SCENARIO");
    if (path == NULL) {
        fprintf(stderr, "libnvml_stub: WATTLINE_NVML_SCENARIO is not set\n");
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "libnvml_stub: cannot open %s\n", path);
        return -1;
    }
    char line[2048];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        rc = parse_line(line, ++lineno);
    }
    fclose(f);
    return rc;
}

/* ---- helpers ------------------------------------------------------------------------ */

static gpu_t *as_gpu(nvmlDevice_t h) {
    for (int i = 0; i < ngpus; i++)
        if ((void *)h == (void *)&gpus[i]) return &gpus[i];
    return NULL;
}

static mig_t *as_mig(nvmlDevice_t h, gpu_t **parent) {
    for (int i = 0; i < ngpus; i++)
        for (int j = 0; j < MAX_MIG; j++)
            if ((void *)h == (void *)&gpus[i].migs[j]) {
                if (parent) *parent = &gpus[i];
                return &gpus[i].migs[j];
            }
    return NULL;
}

/* Next value of a series: 0 with a (and b) set, or the error code of that step. */
static int next(gpu_t *g, int which, long long *a, long long *b) {
    series_t *s = &g->s[which];
    if (!s->present) return E_NOT_SUPPORTED;
    int k = g->calls[which]++;
    if (k >= s->n) k = s->n - 1;
    if (s->err[k]) return s->err[k];
    *a = s->a[k];
    if (b) *b = s->b[k];
    return OK;
}

static int copy_str(char *dst, unsigned int len, const char *src) {
    if (dst == NULL || strlen(src) + 1 > len) return E_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return OK;
}


/* ---- live processes (WATTLINE_NVML_PROCS) ------------------------------------------- */

#define MAX_LIVE 64
#define SAMPLE_BUFFER 100

typedef struct { int gpu, slot; unsigned int pid; double sm, mem, from, until; } live_t;

static double now_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* Lines of the procs file (all, whether their pid lives or not); -1 when unreadable. */
static int read_live(live_t *out) {
    const char *path = getenv("WATTLINE_NVML_PROCS");
    if (path == NULL) return 0;
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0; /* not written yet: no process */
    char line[256], until[64], where[32];
    int n = 0;
    while (n < MAX_LIVE && fgets(line, sizeof line, f) != NULL) {
        live_t *p = &out[n];
        if (sscanf(line, "%31s %u %lf %lf %lf %63s", where, &p->pid, &p->sm, &p->mem, &p->from, until) != 6)
            continue;
        char *slash = strchr(where, '/');
        p->gpu = atoi(where);
        p->slot = slash ? atoi(slash + 1) : -1;
        p->until = strcmp(until, "-") == 0 ? 1e18 : atof(until);
        n++;
    }
    fclose(f);
    return n;
}

static int pid_lives(unsigned int pid) { return kill((pid_t)pid, 0) == 0 || errno == EPERM; }

static int gpu_index(gpu_t *g) { return (int)(g - gpus); }

/* Live processes of g at time t (running and alive): on MIG instance `slot`, on any
 * instance (slot -2), or outside MIG (slot -1). */
static int live_on(gpu_t *g, int slot, double t, live_t *out) {
    live_t all[MAX_LIVE];
    int n = read_live(all), k = 0;
    for (int i = 0; i < n; i++)
        if (all[i].gpu == gpu_index(g) && (slot == -2 ? all[i].slot >= 0 : all[i].slot == slot) &&
            all[i].from <= t && t < all[i].until && pid_lives(all[i].pid))
            out[k++] = all[i];
    return k;
}

/* The energy model's exact energy since its epoch at time t, J. */
static double model_joules(gpu_t *g, double t) {
    live_t all[MAX_LIVE];
    int n = read_live(all);
    double joules = g->idle_w * (t - g->model_epoch);
    for (int i = 0; i < n; i++) {
        if (all[i].gpu != gpu_index(g)) continue;
        double lo = all[i].from, hi = all[i].until < t ? all[i].until : t;
        if (hi > lo) joules += g->w_per_sm * all[i].sm * (hi - lo);
    }
    return joules;
}

/* The energy model's counter at time t, mJ: the exact energy up to the last step. */
static unsigned long long model_energy_mj(gpu_t *g, double t) {
    if (g->step_s > 0) t = g->step_phase_s + floor((t - g->step_phase_s) / g->step_s) * g->step_s;
    double joules = model_joules(g, t);
    return joules > 0 ? (unsigned long long)(joules * 1000.0) : 0ULL;
}

/* The model's power reading at time t, W: instantaneous, or part-time sensed (power_sensing). */
static double model_power_w(gpu_t *g, double t) {
    if (g->sense_update_s <= 0) { /* the lines' power at t: a difference of Unix times a
                                     * microsecond apart is mostly rounding */
        live_t all[MAX_LIVE];
        int n = read_live(all);
        double watts = g->idle_w;
        for (int i = 0; i < n; i++)
            if (all[i].gpu == gpu_index(g) && all[i].from <= t && t < all[i].until) watts += g->w_per_sm * all[i].sm;
        return watts;
    }
    double u = g->sense_update_s, w = g->sense_window_s;
    double last = floor(t / u) * u, sum = 0.0;
    int windows = 0;
    for (double k = floor((last - w) / u); k * u + w > last - g->sense_average_s && windows < 100000; k -= 1.0) {
        sum += (model_joules(g, k * u + w) - model_joules(g, k * u)) / w;
        windows++;
    }
    return windows ? sum / windows : 0.0;
}

/* Utilization samples of the live processes newer than lastSeen: one per process with
 * non-zero use, means over the buffered sample periods; returns how many. */
static unsigned int live_samples(gpu_t *g, unsigned long long last_seen, nvmlProcessUtilizationSample_t *out,
                                 unsigned int room) {
    long long period = g->sample_period_us;
    long long newest = (long long)(now_s() * 1e6) / period * period;
    long long oldest = newest - (SAMPLE_BUFFER - 1) * period;
    if ((long long)last_seen >= oldest) oldest = ((long long)last_seen / period + 1) * period;
    live_t all[MAX_LIVE];
    int n = read_live(all);
    unsigned int k = 0;
    long long count = newest >= oldest ? (newest - oldest) / period + 1 : 0;
    for (int i = 0; i < n && count > 0; i++) {
        if (all[i].gpu != gpu_index(g) || all[i].slot >= 0 || !pid_lives(all[i].pid)) continue;
        double sm = 0, mem = 0;
        long long seen = 0;
        for (long long ts = oldest; ts <= newest; ts += period) {
            /* the sample at ts is the mean over the period (ts - period, ts] */
            double hi = (double)ts / 1e6, lo = hi - (double)period / 1e6;
            double a = all[i].from > lo ? all[i].from : lo, b = all[i].until < hi ? all[i].until : hi;
            if (b <= a) continue;
            sm += all[i].sm * (b - a) / (hi - lo);
            mem += all[i].mem * (b - a) / (hi - lo);
            seen = ts;
        }
        if (seen == 0 || (sm == 0 && mem == 0)) continue;
        if (out != NULL && k < room)
            out[k] = (nvmlProcessUtilizationSample_t){all[i].pid, (unsigned long long)seen,
                                                      (unsigned int)(sm / (double)count + 0.5),
                                                      (unsigned int)(mem / (double)count + 0.5), 0, 0};
        k++;
    }
    return k;
}

/* ---- NVML entry points ------------------------------------------------------------- */

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    count_call(__func__);
    if (!loaded) {
        if (load_scenario() != 0) return E_UNKNOWN;
        loaded = 1;
    }
    if (init_error) return init_error;
    refcount++;
    return OK;
}

int nvmlShutdown(void) {
    ENTER();
    refcount--;
    return OK;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NO_PERMISSION: return "Insufficient Permissions";
    case 15: return "GPU is lost";
    case 28: return "GPU not found";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER();
    return copy_str(version, length, driver);
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER();
    *count = (unsigned int)ngpus;
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER();
    if (index >= (unsigned int)ngpus) return E_INVALID;
    if (gpus[index].handle_error) return gpus[index].handle_error;
    *device = (nvmlDevice_t)(void *)&gpus[index];
    return OK;
}

int nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER();
    gpu_t *g = as_gpu(device);
    if (g == NULL) as_mig(device, &g); /* a MIG device answers with its parent's name */
    if (g == NULL) return E_INVALID;
    return copy_str(name, length, g->name);
}

int nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER();
    gpu_t *g = as_gpu(device);
    mig_t *m = as_mig(device, NULL);
    if (g) return copy_str(uuid, length, g->uuid);
    if (m) return copy_str(uuid, length, m->uuid);
    return E_INVALID;
}

int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    ENTER();
    gpu_t *g = as_gpu(device);
    long long v;
    if (g == NULL) return as_mig(device, NULL) ? E_NOT_SUPPORTED : E_INVALID;
    if (g->energy_model && !g->s[S_ENERGY].present) {
        *energy = model_energy_mj(g, now_s());
        return OK;
    }
    int rc = next(g, S_ENERGY, &v, NULL);
    if (rc == OK) *energy = (unsigned long long)v;
    return rc;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    ENTER();
    gpu_t *g = as_gpu(device);
    long long v;
    if (g == NULL) return as_mig(device, NULL) ? E_NOT_SUPPORTED : E_INVALID;
    if (g->energy_model && !g->s[S_POWER].present) {
        *power = (unsigned int)(model_power_w(g, now_s()) * 1000.0 + 0.5);
        return OK;
    }
    int rc = next(g, S_POWER, &v, NULL);
    if (rc == OK) *power = (unsigned int)v;
    return rc;
}

int nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    ENTER();
    gpu_t *g = as_gpu(device);
    if (g == NULL) return as_mig(device, NULL) ? E_NOT_SUPPORTED : E_INVALID;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *fv = &values[i];
        long long v = 0;
        int instant = fv->fieldId == 186 && fv->scopeId == 0;
        if (instant && g->energy_model && !g->s[S_INSTANT].present) {
            double saved = g->sense_update_s;
            g->sense_update_s = 0; /* the instant field is never the averaged reading */
            v = (long long)(model_power_w(g, now_s()) * 1000.0 + 0.5);
            g->sense_update_s = saved;
            fv->nvmlReturn = OK;
        } else {
            fv->nvmlReturn = instant ? (unsigned int)next(g, S_INSTANT, &v, NULL) : E_NOT_SUPPORTED;
        }
        fv->timestamp = 1700000000000000LL + g->calls[S_INSTANT];
        fv->latencyUsec = 0;
        fv->valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
        fv->value.uiVal = (unsigned int)v;
    }
    return OK;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    ENTER();
    gpu_t *g = as_gpu(device);
    long long a, b;
    if (g == NULL) return as_mig(device, NULL) ? E_NOT_SUPPORTED : E_INVALID;
    int rc = next(g, S_UTIL, &a, &b);
    if (rc == OK) { util->gpu = (unsigned int)a; util->memory = (unsigned int)b; }
    return rc;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER();
    gpu_t *g = as_gpu(device);
    mig_t *m = as_mig(device, NULL);
    long long total, used;
    gpu_t *parent = NULL;
    if (m) as_mig(device, &parent);
    if (m && parent->unprivileged) return E_NO_PERMISSION;
    if (m) { total = (long long)m->total; used = (long long)m->used; }
    else if (g == NULL) return E_INVALID;
    else {
        int rc = next(g, S_MEMORY, &total, &used);
        if (rc != OK) return rc;
    }
    memory->total = (unsigned long long)total;
    memory->used = (unsigned long long)used;
    memory->free = memory->total - memory->used;
    return OK;
}

static int limit(nvmlDevice_t device, int which, unsigned int *out) {
    gpu_t *g = as_gpu(device);
    long long v;
    if (g == NULL) return as_mig(device, NULL) ? E_NOT_SUPPORTED : E_INVALID;
    int rc = next(g, which, &v, NULL);
    if (rc == OK) *out = (unsigned int)v;
    return rc;
}

int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *lim) {
    ENTER();
    return limit(device, S_LIMIT, lim);
}

static int set_limit_of(nvmlDevice_t device, unsigned int *lim);

int nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *lim) {
    ENTER();
    if (set_limit_of(device, lim) == OK) return OK;
    return limit(device, S_MGMT_LIMIT, lim);
}

int nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    ENTER();
    gpu_t *g = as_gpu(device);
    if (g == NULL) return as_mig(device, NULL) ? E_NOT_SUPPORTED : E_INVALID;
    if (g->mig_mode < 0) return E_NOT_SUPPORTED;
    *current = *pending = (unsigned int)g->mig_mode;
    return OK;
}

int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    ENTER();
    gpu_t *g = as_gpu(device);
    if (g == NULL) return E_INVALID;
    if (g->mig_mode < 0) return E_NOT_SUPPORTED;
    *count = g->mig_max;
    return OK;
}

int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    ENTER();
    gpu_t *g = as_gpu(device);
    if (g == NULL || index >= g->mig_max || index >= MAX_MIG) return E_INVALID;
    if (g->mig_mode != 1 || !g->migs[index].present) return E_NOT_FOUND;
    *mig = (nvmlDevice_t)(void *)&g->migs[index];
    return OK;
}

int nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    ENTER();
    mig_t *m = as_mig(device, NULL);
    if (m == NULL) return E_INVALID;
    *id = m->gi;
    return OK;
}

int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    ENTER();
    gpu_t *g = as_gpu(device);
    mig_t *m = as_mig(device, NULL);
    nvmlProcessInfo_t all[MAX_PROCS * (MAX_MIG + 1) + MAX_LIVE];
    live_t live[MAX_LIVE];
    unsigned int n = 0;
    gpu_t *parent = NULL;
    if (m) {
        as_mig(device, &parent);
        for (int i = 0; i < m->nprocs; i++)
            all[n++] = (nvmlProcessInfo_t){m->procs[i].pid, m->procs[i].mem, m->gi, 0};
        int k = live_on(parent, (int)(m - parent->migs), now_s(), live);
        for (int i = 0; i < k; i++) all[n++] = (nvmlProcessInfo_t){live[i].pid, 1048576ULL, m->gi, 0};
    } else if (g && g->mig_mode == 1 && g->unprivileged) {
        return E_NO_PERMISSION;
    } else if (g && g->mig_mode == 1) { /* MIG parent: aggregate over instances */
        for (int j = 0; j < MAX_MIG; j++)
            for (int i = 0; g->migs[j].present && i < g->migs[j].nprocs; i++)
                all[n++] = (nvmlProcessInfo_t){g->migs[j].procs[i].pid, g->migs[j].procs[i].mem, g->migs[j].gi, 0};
        int k = live_on(g, -2, now_s(), live);
        for (int i = 0; i < k; i++)
            all[n++] = (nvmlProcessInfo_t){live[i].pid, 1048576ULL, g->migs[live[i].slot % MAX_MIG].gi, 0};
    } else if (g) {
        for (int i = 0; i < g->nprocs; i++)
            all[n++] = (nvmlProcessInfo_t){g->procs[i].pid, g->procs[i].mem, NO_ID, NO_ID};
        int k = live_on(g, -1, now_s(), live);
        for (int i = 0; i < k; i++)
            all[n++] = (nvmlProcessInfo_t){live[i].pid, 1048576ULL, NO_ID, NO_ID};
    } else {
        return E_INVALID;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return n == 0 ? OK : E_INSUFFICIENT_SIZE;
    }
    memcpy(infos, all, n * sizeof *all);
    *count = n;
    return OK;
}

/* Zombie pid of the over100 quirk: above Linux's pid_max limit (2^22), so never alive. */
#define ZOMBIE_PID 4194305u

int nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                    unsigned int *count, unsigned long long lastSeen) {
    ENTER();
    gpu_t *g = as_gpu(device);
    if (g == NULL) return as_mig(device, NULL) ? E_NOT_SUPPORTED : E_INVALID;
    if (count == NULL) return E_INVALID;
    if (g->mig_mode == 1) return E_NOT_SUPPORTED;
    /* Every sample this call would write: scenario "process" lines (one fresh sample each,
     * newer at each filled call), the live processes', and the quirks' extra ones. */
    enum { ROOM = MAX_PROCS + 5 * MAX_LIVE + 1 };
    nvmlProcessUtilizationSample_t all[ROOM], live[MAX_LIVE];
    unsigned long long ts = (g->sample_epoch + 1) * 1000000ULL;
    unsigned int n = 0, fixed = 0;
    for (int i = 0; ts > lastSeen && i < g->nprocs; i++)
        if (g->procs[i].sm >= 0) {
            all[n++] = (nvmlProcessUtilizationSample_t){g->procs[i].pid, ts, (unsigned int)g->procs[i].sm, 0, 0, 0};
            fixed = 1;
        }
    unsigned int k = live_samples(g, lastSeen, live, MAX_LIVE);
    unsigned long long period = (unsigned long long)g->sample_period_us, newest = 0;
    for (unsigned int i = 0; i < k; i++) {
        newest = live[i].timeStamp > newest ? live[i].timeStamp : newest;
        if (g->stale && lastSeen >= period)
            all[n++] = (nvmlProcessUtilizationSample_t){live[i].pid, lastSeen - period, 100, 100, 0, 0};
        if (g->dup && live[i].timeStamp - period > lastSeen)
            all[n++] = (nvmlProcessUtilizationSample_t){live[i].pid, live[i].timeStamp - period, 0, 0, 0, 0};
        all[n++] = live[i];
    }
    if (k > 0 && g->pid0) all[n++] = (nvmlProcessUtilizationSample_t){0, newest, 37, 0, 0, 0};
    if (k > 0 && g->over100) all[n++] = (nvmlProcessUtilizationSample_t){ZOMBIE_PID, newest, 250, 0, 0, 0};
    /* pad: drivers answer the size of their buffer, not the count (go-nvml #11, nvtop #110) */
    unsigned int need = g->pad ? SAMPLE_BUFFER : n;
    if (n == 0 && !g->pad) return E_NOT_FOUND;
    if (samples == NULL || *count < need) {
        *count = need;
        return E_INSUFFICIENT_SIZE;
    }
    memcpy(samples, all, n * sizeof *all);
    if (g->pad) memset(samples + n, 0, (*count - n) * sizeof *samples); /* count stays the caller's */
    else *count = n;
    if (fixed) g->sample_epoch++;
    return OK;
}

/* ---- power limits set (wattline sweep) ----------------------------------------------
 * The driver keeps a limit set by one process for every other: NVML_STUB_LIMITS names
 * a file of "<gpu index> <mW>" lines, one per nvmlDeviceSetPowerManagementLimit (without it,
 * setting is NotSupported). nvmlDeviceGetPowerManagementLimit answers a GPU's latest line,
 * else its mgmt_limit series. NVML_STUB_SET_ERROR=N: setting answers error N (4:
 * NoPermission). Constraints: NVML_STUB_LIMIT_RANGE="<min mW>:<max mW>" (default
 * 100000:400000).
 */

static int set_limit_of(nvmlDevice_t device, unsigned int *lim) {
    gpu_t *g = as_gpu(device);
    const char *path = getenv("NVML_STUB_LIMITS");
    FILE *f = (g && path) ? fopen(path, "r") : NULL;
    if (f == NULL) return E_NOT_FOUND;
    int idx, found = 0;
    unsigned int mw;
    while (fscanf(f, "%d %u", &idx, &mw) == 2)
        if (idx == gpu_index(g)) { *lim = mw; found = 1; }
    fclose(f);
    return found ? OK : E_NOT_FOUND;
}

int nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit_mw) {
    ENTER();
    gpu_t *g = as_gpu(device);
    const char *path = getenv("NVML_STUB_LIMITS"), *err = getenv("NVML_STUB_SET_ERROR");
    unsigned int lo, hi;
    if (g == NULL) return E_INVALID;
    if (err != NULL && *err) return atoi(err);
    if (path == NULL) return E_NOT_SUPPORTED;
    nvmlDeviceGetPowerManagementLimitConstraints(device, &lo, &hi);
    if (limit_mw < lo || limit_mw > hi) return E_INVALID;
    FILE *f = fopen(path, "a");
    if (f == NULL) return E_UNKNOWN;
    fprintf(f, "%d %u\n", gpu_index(g), limit_mw);
    fclose(f);
    return OK;
}

int nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *min_mw, unsigned int *max_mw) {
    ENTER();
    const char *range = getenv("NVML_STUB_LIMIT_RANGE");
    if (as_gpu(device) == NULL) return E_INVALID;
    *min_mw = 100000;
    *max_mw = 400000;
    if (range != NULL) sscanf(range, "%u:%u", min_mw, max_mw);
    return OK;
}
