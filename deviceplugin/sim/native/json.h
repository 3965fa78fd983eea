/* A small JSON reader for the simulated NVML library: the node rendering and event lines. */
#ifndef NVMLSIM_JSON_H
#define NVMLSIM_JSON_H

#include <stddef.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_kind;

typedef struct json {
    json_kind kind;
    double number;       /* JSON_NUMBER; also 0/1 for JSON_BOOL */
    int integral;        /* JSON_NUMBER: no fraction or exponent, fits in long long */
    long long integer;   /* JSON_NUMBER when integral */
    char *string;        /* JSON_STRING (NUL-terminated) */
    char *key;           /* the member name when inside an object */
    struct json *child;  /* first element or member */
    struct json *next;   /* next sibling */
} json;

/* Parse `text` (`length` bytes); NULL on error with a message in `error` (`size` bytes). */
json *json_parse(const char *text, size_t length, char *error, size_t size);
void json_free(json *value);

/* The member `key` of an object, or NULL. */
const json *json_get(const json *object, const char *key);
size_t json_length(const json *array);

#endif
