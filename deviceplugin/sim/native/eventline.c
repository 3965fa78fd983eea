/* One event line (SPEC section 4) checked and read into a sim_event_line, apart from the node it
 * applies to. Python's reader (sim/events.py, parse_line) accepts and refuses exactly the same
 * lines: tests/data/event-lines.json holds the cases both are run on. */
#include "sim.h"

#include <ctype.h>
#include <string.h>

#include "json.h"

#define MAX_COUNT 0xFFFFFFFFLL
#define MAX_WAIT_ERROR 999

/* NVML return codes by the name events files write, lower case and without '_' (Python's
 * NVMLError class names without the NVMLError_ prefix). */
static const struct { const char *name; int code; } wait_errors[] = {
    {"uninitialized", 1}, {"invalidargument", 2}, {"notsupported", 3}, {"nopermission", 4},
    {"alreadyinitialized", 5}, {"notfound", 6}, {"insufficientsize", 7}, {"insufficientpower", 8},
    {"drivernotloaded", 9}, {"timeout", 10}, {"irqissue", 11}, {"librarynotfound", 12},
    {"functionnotfound", 13}, {"corruptedinforom", 14}, {"gpuislost", 15}, {"resetrequired", 16},
    {"operatingsystem", 17}, {"librmversionmismatch", 18}, {"inuse", 19}, {"memory", 20},
    {"nodata", 21}, {"vgpueccnotsupported", 22}, {"insufficientresources", 23},
    {"freqnotsupported", 24}, {"argumentversionmismatch", 25}, {"deprecated", 26},
    {"notready", 27}, {"gpunotfound", 28}, {"invalidstate", 29}, {"resettypenotsupported", 30},
    {"unknown", 999},
};

/* `unknown`, `gpuIsLost`, `GPU_IS_LOST` and `NVMLError_GpuIsLost` all name code 15; 0: none. */
static int wait_error_code(const char *name) {
    char wanted[64];
    size_t n = 0;
    if (strncmp(name, "NVMLError_", 10) == 0) name += 10;
    for (; *name; name++) {
        if (*name == '_') continue;
        if (n + 1 >= sizeof wanted) return 0;
        wanted[n++] = (char)tolower((unsigned char)*name);
    }
    wanted[n] = '\0';
    for (size_t i = 0; i < sizeof wait_errors / sizeof *wait_errors; i++)
        if (strcmp(wanted, wait_errors[i].name) == 0) return wait_errors[i].code;
    return 0;
}

/* -1: absent; else the value; -2: present but not a count in range. */
static long long count(const json *line, const char *key) {
    const json *v = json_get(line, key);
    if (!v) return -1;
    return v->kind == JSON_NUMBER && v->integral && v->integer >= 0 && v->integer <= MAX_COUNT ? v->integer : -2;
}

/* -1: absent; else 0 or 1; -2: present but not true or false. */
static int flag(const json *line, const char *key) {
    const json *v = json_get(line, key);
    if (!v) return -1;
    return v->kind == JSON_BOOL ? (int)v->number : -2;
}

static const char *read_fields(const json *line, sim_event_line *out) {
    static const char *known[] = {"uuid", "xid", "ecc", "lost", "retiredPagesPending",
                                  "remappedRowsPending", "recoveryAction", "waitError"};
    for (const json *m = line->child; m; m = m->next) {
        int found = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++) found |= strcmp(m->key, known[i]) == 0;
        if (!found) return "unknown key";
    }
    const json *uuid = json_get(line, "uuid"), *ecc = json_get(line, "ecc"), *wait = json_get(line, "waitError");
    if (uuid) {
        if (uuid->kind != JSON_STRING || (strncmp(uuid->string, "GPU-", 4) != 0 && strncmp(uuid->string, "MIG-", 4) != 0))
            return "uuid must be a GPU- or MIG- UUID";
        if (strlen(uuid->string) >= sizeof out->uuid) return "uuid is too long";
        memcpy(out->uuid, uuid->string, strlen(uuid->string) + 1);
    }
    out->xid = count(line, "xid");
    out->recovery_action = count(line, "recoveryAction");
    if (out->xid == -2 || out->recovery_action == -2) return "xid and recoveryAction must be integers from 0 to 2^32-1";
    out->lost = flag(line, "lost");
    out->retired_pages_pending = flag(line, "retiredPagesPending");
    out->remapped_rows_pending = flag(line, "remappedRowsPending");
    if (out->lost == -2 || out->retired_pages_pending == -2 || out->remapped_rows_pending == -2)
        return "lost, retiredPagesPending and remappedRowsPending must be true or false";
    if (ecc) {
        if (ecc->kind == JSON_STRING && strcmp(ecc->string, "single") == 0) out->ecc_type = nvmlEventTypeSingleBitEccError;
        else if (ecc->kind == JSON_STRING && strcmp(ecc->string, "double") == 0) out->ecc_type = nvmlEventTypeDoubleBitEccError;
        else return "ecc must be 'single' or 'double'";
    }
    if (wait) {
        if (wait->kind == JSON_NUMBER && wait->integral && wait->integer > 0 && wait->integer <= MAX_WAIT_ERROR)
            out->wait_error = (nvmlReturn_t)wait->integer;
        else if (wait->kind == JSON_STRING)
            out->wait_error = (nvmlReturn_t)wait_error_code(wait->string);
        if (out->wait_error == NVML_SUCCESS) return "waitError names no NVML error";
    }
    int acts = out->xid >= 0 || out->recovery_action >= 0 || out->lost >= 0 || out->retired_pages_pending >= 0 ||
               out->remapped_rows_pending >= 0 || out->ecc_type;
    if (!acts && !wait) return "says nothing to do";
    if (!uuid && acts) return "needs a uuid";
    return NULL;
}

const char *sim_event_parse(const char *text, size_t length, sim_event_line *out) {
    char error[128];
    memset(out, 0, sizeof *out);
    json *line = json_parse(text, length, error, sizeof error);
    if (!line) return "not JSON";
    const char *problem = line->kind == JSON_OBJECT ? read_fields(line, out) : "not a JSON object";
    json_free(line);
    return problem;
}

int sim_event_blank(const char *text, size_t length) {
    for (size_t i = 0; i < length; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\n') return 0;
    return 1;
}
