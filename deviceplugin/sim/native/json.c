/* A small JSON reader (RFC 8259): enough for the node rendering `deviceplugin sim-root` writes
 * and for event lines. It refuses what Python's reader of the same lines (sim/events.py)
 * refuses, so both simulators read a line alike: text that is not UTF-8, duplicate member
 * names, NUL or lone surrogates in strings, numbers with leading zeros. Recursion is bounded,
 * and so is the member count of one object (duplicates are found by comparing names). */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_MEMBERS 4096

typedef struct {
    const char *p, *end;
    char *error;
    size_t size;
} reader;

static json *value(reader *r, int depth);

static int fail(reader *r, const char *what) {
    if (r->error && r->size && !r->error[0])
        snprintf(r->error, r->size, "%s", what);
    return 0;
}

static void skip_space(reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static json *node(json_kind kind) {
    json *v = calloc(1, sizeof *v);
    if (v) v->kind = kind;
    return v;
}

static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits at s (before end) -> *code. */
static int escape4(const char *s, const char *end, unsigned *code) {
    *code = 0;
    for (int i = 0; i < 4; i++) {
        int h = s + i < end ? hex(s[i]) : -1;
        if (h < 0) return 0;
        *code = *code * 16 + (unsigned)h;
    }
    return 1;
}

/* A code point as UTF-8: never longer than the escape it came from (6 or 12 bytes). */
static char *put_utf8(char *o, unsigned code) {
    if (code < 0x80) { *o++ = (char)code; }
    else if (code < 0x800) { *o++ = (char)(0xC0 | code >> 6); *o++ = (char)(0x80 | (code & 0x3F)); }
    else if (code < 0x10000) {
        *o++ = (char)(0xE0 | code >> 12); *o++ = (char)(0x80 | ((code >> 6) & 0x3F));
        *o++ = (char)(0x80 | (code & 0x3F));
    } else {
        *o++ = (char)(0xF0 | code >> 18); *o++ = (char)(0x80 | ((code >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((code >> 6) & 0x3F)); *o++ = (char)(0x80 | (code & 0x3F));
    }
    return o;
}

/* Whether text is UTF-8 as Python's strict decoder reads it: no overlong forms, no encoded
 * surrogates, nothing past U+10FFFF. */
static int valid_utf8(const unsigned char *s, size_t length) {
    size_t i = 0;
    while (i < length) {
        unsigned char c = s[i];
        size_t extra;
        unsigned code, least;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { extra = 1; code = c & 0x1F; least = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { extra = 2; code = c & 0x0F; least = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { extra = 3; code = c & 0x07; least = 0x10000; }
        else return 0;
        if (length - i <= extra) return 0;
        for (size_t k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            code = code << 6 | (s[i + k] & 0x3F);
        }
        if (code < least || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
        i += extra + 1;
    }
    return 1;
}

static char *string(reader *r) {
    /* r->p is at the opening quote; the decoded text is never longer than the raw one. */
    const char *start = ++r->p;
    while (r->p < r->end && *r->p != '"') r->p += (*r->p == '\\' && r->end - r->p > 1) ? 2 : 1;
    if (r->p >= r->end) { fail(r, "unterminated string"); return NULL; }
    char *out = malloc((size_t)(r->p - start) + 1), *o = out;
    if (!out) { fail(r, "out of memory"); return NULL; }
    for (const char *s = start; s < r->p; s++) {
        if ((unsigned char)*s < 0x20) { free(out); fail(r, "control character in string"); return NULL; }
        if (*s != '\\') { *o++ = *s; continue; }
        s++;
        switch (*s) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned code = 0;
            if (!escape4(s + 1, r->p, &code)) { free(out); fail(r, "bad \\u escape"); return NULL; }
            s += 4;
            if (code >= 0xD800 && code <= 0xDBFF) {
                unsigned low = 0;
                if (s + 2 >= r->p || s[1] != '\\' || s[2] != 'u' || !escape4(s + 3, r->p, &low) ||
                    low < 0xDC00 || low > 0xDFFF) {
                    free(out); fail(r, "lone surrogate in \\u escape"); return NULL;
                }
                s += 6;
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            } else if (code >= 0xDC00 && code <= 0xDFFF) {
                free(out); fail(r, "lone surrogate in \\u escape"); return NULL;
            }
            if (code == 0) { free(out); fail(r, "NUL in string"); return NULL; }
            o = put_utf8(o, code);
            break;
        }
        default: free(out); fail(r, "bad escape"); return NULL;
        }
    }
    *o = '\0';
    r->p++;
    return out;
}

static json *number(reader *r) {
    const char *s = r->p;
    int negative = 0, integral = 1, digits = 0;
    unsigned long long whole = 0;
    int overflow = 0;
    if (s < r->end && *s == '-') { negative = 1; s++; }
    if (r->end - s >= 2 && s[0] == '0' && s[1] >= '0' && s[1] <= '9') { fail(r, "bad number"); return NULL; }
    while (s < r->end && *s >= '0' && *s <= '9') {
        unsigned d = (unsigned)(*s - '0');
        if (whole > (0x7fffffffffffffffULL - d) / 10) overflow = 1; else whole = whole * 10 + d;
        s++; digits++;
    }
    if (!digits) { fail(r, "bad number"); return NULL; }
    double value = (double)whole, scale = 1;
    if (s < r->end && *s == '.') {
        integral = 0; s++;
        if (s >= r->end || *s < '0' || *s > '9') { fail(r, "bad number"); return NULL; }
        while (s < r->end && *s >= '0' && *s <= '9') { scale /= 10; value += (*s - '0') * scale; s++; }
    }
    if (s < r->end && (*s == 'e' || *s == 'E')) {
        integral = 0; s++;
        int esign = 1, exponent = 0;
        if (s < r->end && (*s == '+' || *s == '-')) { esign = *s == '-' ? -1 : 1; s++; }
        if (s >= r->end || *s < '0' || *s > '9') { fail(r, "bad number"); return NULL; }
        while (s < r->end && *s >= '0' && *s <= '9') { if (exponent < 400) exponent = exponent * 10 + (*s - '0'); s++; }
        for (int i = 0; i < exponent; i++) value = esign > 0 ? value * 10 : value / 10;
    }
    json *v = node(JSON_NUMBER);
    if (!v) { fail(r, "out of memory"); return NULL; }
    v->number = negative ? -value : value;
    v->integral = integral && !overflow;
    v->integer = negative ? -(long long)whole : (long long)whole;
    r->p = s;
    return v;
}

static int literal(reader *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return fail(r, "unexpected text");
    r->p += n;
    return 1;
}

static json *container(reader *r, int depth, json_kind kind) {
    char close = kind == JSON_ARRAY ? ']' : '}';
    json *v = node(kind), **tail;
    if (!v) { fail(r, "out of memory"); return NULL; }
    tail = &v->child;
    r->p++;
    skip_space(r);
    if (r->p < r->end && *r->p == close) { r->p++; return v; }
    for (size_t members = 0;; members++) {
        char *key = NULL;
        skip_space(r);
        if (kind == JSON_OBJECT) {
            if (members >= MAX_MEMBERS) { fail(r, "too many members"); break; }
            if (r->p >= r->end || *r->p != '"') { fail(r, "expected a member name"); break; }
            if (!(key = string(r))) break;
            if (json_get(v, key)) { free(key); fail(r, "duplicate member name"); break; }
            skip_space(r);
            if (r->p >= r->end || *r->p != ':') { free(key); fail(r, "expected ':'"); break; }
            r->p++;
        }
        json *item = value(r, depth + 1);
        if (!item) { free(key); break; }
        item->key = key;
        *tail = item;
        tail = &item->next;
        skip_space(r);
        if (r->p < r->end && *r->p == ',') { r->p++; continue; }
        if (r->p < r->end && *r->p == close) { r->p++; return v; }
        fail(r, kind == JSON_ARRAY ? "expected ',' or ']'" : "expected ',' or '}'");
        break;
    }
    json_free(v);
    return NULL;
}

static json *value(reader *r, int depth) {
    if (depth > MAX_DEPTH) { fail(r, "nested too deeply"); return NULL; }
    skip_space(r);
    if (r->p >= r->end) { fail(r, "unexpected end"); return NULL; }
    json *v;
    switch (*r->p) {
    case '{': return container(r, depth, JSON_OBJECT);
    case '[': return container(r, depth, JSON_ARRAY);
    case '"': {
        char *s = string(r);
        if (!s) return NULL;
        if (!(v = node(JSON_STRING))) { free(s); fail(r, "out of memory"); return NULL; }
        v->string = s;
        return v;
    }
    case 't': case 'f': {
        int truth = *r->p == 't';
        if (!literal(r, truth ? "true" : "false")) return NULL;
        if ((v = node(JSON_BOOL))) v->number = truth;
        return v;
    }
    case 'n':
        return literal(r, "null") ? node(JSON_NULL) : NULL;
    default:
        return number(r);
    }
}

json *json_parse(const char *text, size_t length, char *error, size_t size) {
    reader r = {text, text + length, error, size};
    if (error && size) error[0] = '\0';
    if (!valid_utf8((const unsigned char *)text, length)) { fail(&r, "not UTF-8"); return NULL; }
    json *v = value(&r, 0);
    if (!v) return NULL;
    skip_space(&r);
    if (r.p != r.end) { json_free(v); fail(&r, "text after the value"); return NULL; }
    return v;
}

void json_free(json *v) {
    while (v) {
        json *next = v->next;
        json_free(v->child);
        free(v->string);
        free(v->key);
        free(v);
        v = next;
    }
}

const json *json_get(const json *object, const char *key) {
    if (!object || object->kind != JSON_OBJECT) return NULL;
    for (const json *m = object->child; m; m = m->next)
        if (strcmp(m->key, key) == 0) return m;
    return NULL;
}

size_t json_length(const json *array) {
    size_t n = 0;
    if (array && (array->kind == JSON_ARRAY || array->kind == JSON_OBJECT))
        for (const json *e = array->child; e; e = e->next) n++;
    return n;
}
